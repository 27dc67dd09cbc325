"""What the result rows of a procedure satisfy: :class:`RowRules`, which a procedure states
(:meth:`~dmae_fast.stats.procedure.Procedure.rules`) and the checks of a resumed or analyzed results file apply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dmae_fast.stats.decisions import Certificate


@dataclass(frozen=True)
class RowRules:
    """What every row of a run satisfies: the run's kind, sample counts, level and sigma. A field that is None is
    unknown (rows read without their run record): only what holds for every value of it is checked."""

    kind: str  # "certify" or "predict"
    n0: int | None  # None: unknown, or not the same in every row (incremental CERTIFY's)
    sizes: tuple[int, ...] | None  # allowed n (one for fixed n; every look for sequential runs)
    level: float | None  # the Clopper-Pearson level of the bound (alpha, or alpha / K) or PREDICT's alpha
    sigma: float | None
    procedure: str | None  # the `procedure` column (certify only)
    # (idx, nA, n) -> the Certificate the procedure gives (the exact sequential test's, an incremental run's against
    # its reference's row of image idx); None: Clopper-Pearson at level
    certificate: Callable[[int, int, int], Certificate] | None = None
    # (nA, n) -> the grid radius the exact sequential test certified (its rows' grid_radius column); None: no column
    grid_radius: Callable[[int, int], float] | None = None

    @classmethod
    def unknown(cls, kind: str) -> RowRules:
        """The rules of a run of ``kind`` whose settings are unknown: what its rows alone prove."""
        return cls(kind, None, None, None, None, None)
