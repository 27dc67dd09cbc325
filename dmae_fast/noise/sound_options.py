"""What ``--sound`` asks for, without torch (the commands check it before loading anything): :class:`Sound`, the
grids, and the one rule for a run's default grid. The rounded Gaussian itself: :mod:`.sound`; the grid checks and
``--quantize``: :mod:`.grid`; its thresholds and cost: :mod:`dmae_fast.stats.rounded_gaussian`."""

from __future__ import annotations

from dataclasses import dataclass

from dmae_fast.base.errors import UserError

BYTE_GRID, DEMO_GRID = 255, 16  # --sound's grids: 8-bit images; the demo digits' 17 grey levels k/16


def default_grid(demo: bool) -> int:
    """The grid ``--sound`` puts inputs on unless told: the demo digits' own 1/16, else 8 bits (1/255)."""
    return DEMO_GRID if demo else BYTE_GRID


@dataclass(frozen=True)
class Sound:
    """``--sound``: inputs on the 1/``grid`` grid and the rounded Gaussian drawn exactly on it (docs/sound.md);
    ``quantize``: round off-grid inputs onto it (the certificate is then the rounded image's) instead of refusing."""

    grid: int = BYTE_GRID
    quantize: bool = False

    def validate(self, sigma: float | None = None) -> None:
        """Refuse a grid outside [1, 65536]; with a ``sigma``, also a noise table too large to build (at once)."""
        if not (isinstance(self.grid, int) and 1 <= self.grid <= 2**16):
            raise UserError(f"the --sound grid must be a whole number in [1, 65536], got {self.grid!r}")
        if sigma is not None:
            from dmae_fast.stats.rounded_gaussian import table_problem  # mpmath: only for --sound

            problem = table_problem(sigma, self.grid)
            if problem is not None:
                raise UserError(problem)

    def record(self) -> dict:
        return {"grid": self.grid, "quantize": self.quantize}
