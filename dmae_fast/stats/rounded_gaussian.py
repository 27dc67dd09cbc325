"""The rounded Gaussian of ``--sound``: its exact integer thresholds and what they cost.

On the 1/L grid the noise is Z = round(L * eps), eps ~ N(0, sigma^2); with s = L * sigma, a sampler draws a
uniform 64-bit integer U and returns the k with T_{k-1} <= U < T_k, where T_k = floor(2**64 * Phi((k + 1/2) / s))
for k = -K .. K-1 (T_{-K-1} = 0, T_K = 2**64). What the 64-bit thresholds and the cut tails change is bounded
in total variation (:attr:`SoundTable.tv_per_element`), which a run adds to alpha. The contract is docs/sound.md."""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

import mpmath
import numpy as np

from dmae_fast.base.errors import UserError

BITS = 64  # bits of the uniform integer U
TAIL = Fraction(1, 2**70)  # the most probability P(|Z| > K) the truncation may cut
DIGITS = (60, 120)  # the precisions (significant decimal digits) whose thresholds must agree
MIN_STEPS = 1e-6  # the smallest s = grid * sigma taken (far below it mpmath's erfc overflows)
MAX_STEPS = 4096  # the largest s taken: K <= MAX_K (a table builds in seconds)
MAX_K = 39_297  # K at s = MAX_STEPS: P(|Z| > K) <= 2**-70 needs (K + 1/2) / s >= 9.594


@dataclass(frozen=True, eq=False)
class SoundTable:
    """The sampler of the rounded Gaussian for one (sigma, grid): ``thresholds`` holds S_k = T_k - 2**63 for k = -K ..
    K-1 (int64, ascending, read-only); ``tv_per_element`` bounds the total variation from the exact distribution."""

    grid: int
    sigma: float
    K: int
    thresholds: np.ndarray
    tv_per_element: float


def table_problem(sigma: float, grid: int) -> str | None:
    """Why no table is built for noise level ``sigma`` on the 1/``grid`` grid (None when one is): s = grid * sigma
    must be in [MIN_STEPS, MAX_STEPS]. Checked exactly, before any work, so a huge sigma or grid is refused at once."""
    if isinstance(grid, bool) or not isinstance(grid, numbers.Integral) or grid < 1:
        return f"the grid of --sound must be a whole number of levels >= 1, got {grid}"
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not (math.isfinite(sigma) and sigma > 0):
        return f"sigma must be a positive finite number for --sound, got {sigma}"
    steps = Fraction(float(sigma)) * int(grid)
    if steps < MIN_STEPS:
        return (f"sigma {sigma} is {float(steps):g} steps of the 1/{grid} grid, below {MIN_STEPS:g}: "
                "--sound's noise would always round to 0")
    if steps > MAX_STEPS:
        return (f"sigma {sigma} on the 1/{grid} grid is too wide for --sound: its noise table would exceed "
                f"K = {MAX_K:,} levels each side (grid * sigma must be at most {MAX_STEPS})")
    return None


def sound_table(sigma: float, grid: int) -> SoundTable:
    """The checked, cached table of noise level ``sigma`` (pixel units) on the 1/``grid`` grid; UserError if refused."""
    problem = table_problem(sigma, grid)
    if problem is not None:
        raise UserError(problem)
    return _table(float(sigma), int(grid))


@functools.lru_cache(maxsize=16)
def _table(sigma: float, grid: int) -> SoundTable:
    K = _truncation(sigma, grid)
    (low, _), (high, lower_tails) = (_thresholds(sigma, grid, K, digits) for digits in DIGITS)
    if low != high:
        k, a, b = next((k, a, b) for k, a, b in zip(range(-K, K), low, high, strict=True) if a != b)
        raise RuntimeError(f"the --sound threshold T_{k} for sigma {sigma} on the 1/{grid} grid is {a} at "
                           f"{DIGITS[0]} digits but {b} at {DIGITS[1]}: the table is not exact")
    thresholds = np.array([t - 2 ** (BITS - 1) for t in high], dtype=np.int64)
    thresholds.flags.writeable = False
    return SoundTable(grid, sigma, K, thresholds, _total_variation(high, lower_tails, DIGITS[1]))


def _context(digits: int) -> mpmath.ctx_mp.MPContext:
    """A private mpmath context (the global one is shared with every thread)."""
    ctx = mpmath.MPContext()
    ctx.dps = digits
    return ctx


def _lower_tail(ctx: mpmath.ctx_mp.MPContext, x: mpmath.mpf) -> mpmath.mpf:
    """Phi(-x), without cancellation in the tails."""
    return ctx.erfc(x / ctx.sqrt(2)) / 2


def _truncation(sigma: float, grid: int) -> int:
    """K: the smallest integer >= 1 with P(|Z| > K) = 2 * Phi(-(K + 1/2) / s) <= 2**-70."""
    ctx = _context(DIGITS[1])
    s, limit = ctx.mpf(sigma) * grid, ctx.mpf(TAIL.numerator) / TAIL.denominator

    def cut(k: int) -> mpmath.mpf:
        return 2 * _lower_tail(ctx, (k + ctx.mpf(0.5)) / s)

    K = max(1, int(ctx.ceil(s * ctx.sqrt(2) * ctx.erfinv(1 - limit) - ctx.mpf(0.5))))  # the real root, rounded up
    while cut(K) > limit:
        K += 1
    while K > 1 and cut(K - 1) <= limit:
        K -= 1
    return K


def _thresholds(sigma: float, grid: int, K: int, digits: int) -> tuple[list[int], list[mpmath.mpf]]:
    """T_{-K} .. T_{K-1} at ``digits`` digits, and the lower tails P_j = Phi(-(j + 1/2) / s), j = 0 .. K.

    By symmetry Phi((k + 1/2) / s) is P_{-k-1} for k < 0 and 1 - P_k for k >= 0, where
    floor(2**64 (1 - P_k)) = 2**64 - ceil(2**64 P_k) keeps the full relative precision of a tiny P_k."""
    ctx = _context(digits)
    s, scale = ctx.mpf(sigma) * grid, ctx.mpf(2) ** BITS
    tails = [_lower_tail(ctx, (j + ctx.mpf(0.5)) / s) for j in range(K + 1)]
    below = [int(ctx.floor(scale * p)) for p in reversed(tails[:K])]
    above = [2**BITS - int(ctx.ceil(scale * p)) for p in tails[:K]]
    return below + above, tails


def _total_variation(thresholds: list[int], tails: list[mpmath.mpf], digits: int) -> float:
    """1/2 (sum over |k| <= K of |q_k - p_k| + P(|Z| > K)), rounded up to a float."""
    ctx = _context(digits)
    K = len(thresholds) // 2
    cdf = [tails[j] for j in reversed(range(K + 1))] + [1 - tails[j] for j in range(K + 1)]  # Phi((k+1/2)/s), k=-K-1..K
    ends = [0, *thresholds, 2**BITS]
    scale = ctx.mpf(2) ** BITS
    gap = ctx.fsum(abs((ends[i] - ends[i - 1]) / scale - (cdf[i] - cdf[i - 1])) for i in range(1, len(ends)))
    tv = (gap + 2 * tails[K]) / 2
    # float() rounds to nearest; one step up covers that and mpmath's error (~1e-118 relative)
    return math.nextafter(float(tv), math.inf)
def rounded_up(value: Fraction) -> float:
    """The smallest float >= ``value``."""
    rounded = float(value)
    return rounded if Fraction(rounded) >= value else math.nextafter(rounded, math.inf)


def tv_per_image(table: SoundTable, samples_per_image: int, elements: int) -> float:
    """The total variation added to alpha per image: samples * elements * tv (union bound), rounded up."""
    return rounded_up(Fraction(table.tv_per_element) * samples_per_image * elements)


def guarantee(table: SoundTable, samples_per_image: int, elements: int, alpha: float) -> dict[str, float | int]:
    """What a ``--sound`` run states: the table's truncation and cost, and each image's failure probability
    alpha + samples * elements * tv (rounded up)."""
    tv = tv_per_image(table, samples_per_image, elements)
    return {"grid": table.grid, "K": table.K, "tv_per_element": table.tv_per_element,
            "samples_per_image": samples_per_image, "elements": elements, "tv_per_image": tv,
            "failure_probability": rounded_up(Fraction(alpha) + Fraction(tv))}
