"""The exact calibration of group-sequential CERTIFY (item 1 of :mod:`.group_sequential`'s proof): a dynamic
program over the binomial paths of the failure counts, and the search over it for each level's failure bounds."""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import ndtr

from dmae_fast.stats.sequential import lower_bounds, min_counts
from dmae_fast.stats.table_cache import cached_tables

MARGIN = 1e-6  # relative margin under alpha against floating-point rounding in the DP
TAIL = 1e-40  # probability mass the DP may truncate per step (counted as rejected)
DIRECT = 64  # convolve directly below this length, by FFT above
PRECISE_BELOW = 1e-6  # below this alpha the DP runs precise (see _dp): an FFT's rounding (~1e-17) counts there
PRECISE_TAIL = 1e-9  # the precise DP's truncated mass per window edge and step, relative to alpha


def _increment(m: int, q: float, tail: float | None) -> tuple[int, np.ndarray, float]:
    """Failures among m new samples at failure probability q: (first value, pmf window, mass outside).

    The window spans 40 standard deviations (+ 40) each side, or with ``tail`` (precise DP) as much as leaves out
    at most ``tail`` each side by Bernstein's inequality, that bound being the mass outside (SciPy's binomial
    tails underflow near 1e-250; its pmf holds to 1e-11 relative down to 1e-300)."""
    from scipy.stats import binom  # on first use: the tables are built once per setting and cached

    if tail is None:
        spread = 40 * math.sqrt(m * q * (1 - q)) + 40
    else:  # P(|X - mq| >= t) <= exp(-t^2 / (2 (mq(1-q) + t/3))) each side, <= tail for this t
        spread = math.sqrt(2 * m * q * (1 - q) * -math.log(tail)) - math.log(tail)
    lo, hi = max(0, math.floor(m * q - spread)), min(m, math.ceil(m * q + spread))
    pmf = binom.pmf(np.arange(lo, hi + 1), m, q)
    if tail is not None:
        return lo, pmf, tail * ((lo > 0) + (hi < m))
    outside = (binom.cdf(lo - 1, m, q) if lo > 0 else 0.0) + binom.sf(hi, m, q)
    return lo, pmf, float(outside)


def _dp(looks: tuple[int, ...], q: float, bounds: np.ndarray | None = None, targets: np.ndarray | None = None,
        ceiling: np.ndarray | None = None, tail: float | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """The exact DP over failure counts at failure probability q: evaluates given failure ``bounds``, or picks
    at each look the largest bound (at most ``ceiling``) whose cumulative rejection probability, plus the
    truncated mass, stays within ``targets`` (cumulative through each look). Returns (bounds, rejection
    probability at each look, truncated mass).

    With ``tail`` (precise, for tiny alpha) it convolves directly, never by FFT (whose rounding, 1e-17, would swamp
    a mass of 1e-300), and truncates at most ``tail`` per window edge and step, counting it as rejected."""
    from scipy.signal import fftconvolve
    from scipy.stats import binom

    out = np.full(len(looks), -1, dtype=np.int64)
    rejected = np.zeros(len(looks))
    start, alive, truncated, prev = 0, np.ones(1), 0.0, 0  # alive[i]: P(F = start + i, not rejected)
    for k, look in enumerate(looks):
        lo, pmf, outside = _increment(look - prev, q, tail)
        prev, truncated = look, truncated + outside
        if tail is not None or min(alive.size, pmf.size) < DIRECT:
            alive = np.convolve(alive, pmf)
        else:
            alive = np.maximum(fftconvolve(alive, pmf), 0.0)
        start += lo
        if tail is None:
            end = int(binom.isf(TAIL, look, q)) + 1 - start  # beyond: mass <= TAIL even unconditionally
            cut = TAIL
        else:
            above = np.cumsum(alive[::-1])[::-1]  # above[i]: the mass at start + i and beyond
            end = int(np.count_nonzero(above > tail))
            cut = float(above[end]) if end < alive.size else 0.0
        if end < alive.size:
            alive, truncated = alive[:max(end, 0)], truncated + cut
        mass = np.cumsum(alive)
        if bounds is not None:
            d = int(bounds[k])
        else:
            assert targets is not None and ceiling is not None, "bounds, or targets and ceiling"
            budget = targets[k] - rejected.sum() - truncated
            d = start + int(np.searchsorted(mass, budget, side="right")) - 1
            d = min(d, int(ceiling[k]), look)
        i = min(d - start, alive.size - 1)
        if i >= 0:
            rejected[k] = mass[i]
            alive, start = alive[i + 1:], start + i + 1
        out[k] = d
        if not alive.size:
            alive, start = np.zeros(1), look + 1
    return out, rejected, truncated


def reachable(cap: int, alpha: float, z: float) -> bool:
    """Whether cap votes for cA out of cap can reject H: p <= Phi(z) at alpha (Phi(z)^cap <= alpha)."""
    return cap * math.log1p(-float(ndtr(-z))) <= math.log(alpha)


def fixed_n_failures(n: int, alpha: float, z: float) -> int:
    """The most failures in n samples whose fixed-n Clopper-Pearson bound at alpha is >= Phi(z) (-1: none)."""
    # n minus the fewest votes for cA whose bound reaches Phi(z) (min_counts gives n + 1 where none does: -1)
    return n - int(min_counts(lower_bounds, n, alpha, np.array([ndtr(z)]))[0])


def spending_bounds(looks: tuple[int, ...], z: float, alpha: float, cap: int, rho: float,
                    ceiling: np.ndarray) -> np.ndarray:
    """Failure bounds at each look up to ``cap`` of the test of H: p <= Phi(z), calibrated by the exact DP at
    alpha with alpha * (L_k / cap) ** rho spent by look k, each at most ``ceiling`` (-1 beyond ``cap``)."""
    k_end = looks.index(cap) + 1
    targets = alpha * (1 - MARGIN) * (np.array(looks[:k_end]) / cap) ** rho
    tail = alpha * PRECISE_TAIL if alpha < PRECISE_BELOW else None
    row = np.full(len(looks), -1, dtype=np.int64)
    row[:k_end] = _dp(looks[:k_end], float(ndtr(-z)), targets=targets, ceiling=ceiling[:k_end], tail=tail)[0]
    return row


@functools.lru_cache(maxsize=64)
def boundary_table(looks: tuple[int, ...], z: tuple[float, ...], alpha: float, caps: tuple[int, ...],
                   spending: tuple[float, ...], final_shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Failure bounds d[j, k] of every level j (threshold Phi(z[j]), z increasing; caps[j] its last look; -1 where
    it cannot be rejected), calibrated by the exact DP at alpha, and each level's spending exponent rho: the first
    of ``spending`` whose last bound is at least fixed-n Clopper-Pearson's at threshold Phi(z[j] + final_shift)
    (the last one if none is), with alpha * (L_k / cap) ** rho spent by look k. Cached per configuration, in memory
    and on disk (:mod:`.table_cache`)."""
    def check(tables: tuple[np.ndarray, ...]) -> bool:
        return len(tables) == 2 and _valid_table(tables[0], tables[1], looks, len(z), caps, spending)

    table, rhos = cached_tables("boundary table", lambda: _boundary_table(looks, z, alpha, caps, spending, final_shift),
                                check, looks=looks, z=z, alpha=alpha, caps=caps, spending=spending,
                                final_shift=final_shift)
    return table, rhos


def _boundary_table(looks: tuple[int, ...], z: tuple[float, ...], alpha: float, caps: tuple[int, ...],
                    spending: tuple[float, ...], final_shift: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`boundary_table`, computed."""
    looks_array = np.array(looks)
    table = np.full((len(z), len(looks)), -1, dtype=np.int64)
    rhos = np.full(len(z), np.nan)
    ceiling = looks_array  # monotone in j: no level is rejected where the one below is not
    for j, (zj, cap) in enumerate(zip(z, caps)):
        k_end = looks.index(cap) + 1
        if reachable(cap, alpha, zj):
            wanted = fixed_n_failures(cap, alpha, zj + final_shift)
            for rho in spending:
                table[j] = spending_bounds(looks, zj, alpha, cap, rho, ceiling)
                rhos[j] = rho
                if table[j, k_end - 1] >= wanted:
                    break
        ceiling = np.concatenate([table[j, :k_end], looks_array[k_end:]])
    return table, rhos


def _valid_table(table: np.ndarray, rhos: np.ndarray, looks: tuple[int, ...], levels: int, caps: tuple[int, ...],
                 spending: tuple[float, ...]) -> bool:
    """Whether a boundary table read back has the shape, types and structure :func:`_boundary_table` gives: bounds
    in [-1, look], -1 past each level's cap, monotone in the level up to its cap, a spending exponent of
    ``spending`` (or none) per level."""
    looks_array = np.array(looks)
    if table.dtype != np.int64 or table.shape != (levels, len(looks)) or rhos.dtype != np.float64 \
            or rhos.shape != (levels,) or np.any(table < -1) or np.any(table > looks_array):
        return False
    ceiling = looks_array
    for j, cap in enumerate(caps):
        k_end = looks.index(cap) + 1
        if np.any(table[j, k_end:] != -1) or np.any(table[j, :k_end] > ceiling[:k_end]):
            return False
        if not (np.isnan(rhos[j]) or float(rhos[j]) in spending):
            return False
        ceiling = np.concatenate([table[j, :k_end], looks_array[k_end:]])
    return True
