"""The continuous radius of group-sequential CERTIFY: a lower confidence limit for p, valid at alpha under the
design that ran (its looks, levels, futility stops and lower cap), never below the grid level the test certified.

The family of tests. Besides the grid's levels j (thresholds t_j = Phi(z_j), failure bounds d_j), the design holds
a test of H_t: p <= t at every t = Phi(z) with z on the dense grid z_j + i * Z_STEP strictly between consecutive
levels, and above the top reachable level up to what the cap can reach. Each is calibrated like the grid's levels
(:func:`~.boundary_dp.spending_bounds`: failure bounds b_t chosen look by look by the exact DP so that
P_t(F_k <= b_t[k] for some k) <= alpha, spending alpha * (L_k / cap) ** rho with the rho of the level above, or of
the level below where the one above cannot be rejected at its cap, and above the top level; up to the lower cap
below the top level, as the levels around it). The tests are **nested**: going up one interval, each test's bounds
are at most those of the test below it (the DP's ceiling) and at least those of the grid level above it; where the
DP's bounds fall below that level's anywhere, the test takes that level's bounds instead, valid at t < t_{j+1}
because rejecting is only likelier at a higher p (:mod:`.group_sequential`, item 2).

The limit. An image that stops at look tau with F failures certified grid level J: its limit p_L is the largest
threshold of the family whose test rejects at tau (F <= b_t[tau]; past the lower cap, a level below the top counts
as rejected, as in the grid); the radius is sigma * z of that threshold, pA_lower its Phi(z). The decision and the
samples drawn are the grid test's; only the radius between t_J and t_{J+1} is new.

Why p_L is never below the grid's. The grid's levels are members of the family: t_J's test rejects, so p_L >= t_J.

Why P_p(p_L > p) <= alpha for every p in (0, 1). Let t+ be the smallest threshold of the family above p. If
p_L > p then p_L >= t+, so some test t >= t+ rejects at tau, and by nesting so does t+'s: F_tau <= b_t+[tau] (past
the lower cap, for a t+ capped there: the image went on only because every level below the top rejected at the
lower cap, so by nesting t+'s test rejected there). Either way t+'s rejection event {F_k <= b_t+[k] for some k}
occurred, which is increasing in p (fewer failures on every path of a coupling), so its probability under p < t+ is
at most under t+, at most alpha. Any stopping rule is covered: the events are those of the tests, not of the stops.

The radius is exact on the dense grid (a step of Z_STEP * sigma, rounded down to it); the tests of an interval are
built when an image first lands in it and kept with the certifier."""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import ndtri

from dmae_fast.stats.boundary_dp import reachable, spending_bounds
from dmae_fast.stats.table_cache import cached_tables

Z_STEP = 0.02  # the dense grid's step in z = radius / sigma


class RadiusFamily:
    """The nested tests of one group-sequential design (see the module doc): ``looks``, the grid's ``z`` and failure
    bounds ``failures[j, k]``, each level's spending exponent ``rhos[j]`` and last look ``caps[j]``, ``target``
    (the top level the cap reaches) and ``alpha``."""

    def __init__(self, looks: tuple[int, ...], z: np.ndarray, failures: np.ndarray, rhos: np.ndarray,
                 caps: np.ndarray, target: int, alpha: float) -> None:
        self.looks, self.z, self.failures, self.rhos = looks, z, failures, rhos
        self.caps, self.target, self.alpha = caps, target, alpha
        self.top_z = float(ndtri(alpha ** (1 / looks[-1])))  # all cap votes for cA: the cap's reach

    def limit_z(self, look: int, failures: int, level: int) -> float:
        """z of the limit of an image stopped at look ``look`` (0-based) with ``failures`` after certifying grid
        ``level`` (>= 0): the largest z of the family whose test rejects there."""
        z_values, bounds = self.interval(level)
        rejected = np.flatnonzero(failures <= bounds[:, look])
        return float(z_values[rejected[-1]]) if rejected.size else float(self.z[level])

    def max_z(self) -> float:
        """The largest z any outcome can reach: the top test above the top level that rejects with no failure."""
        z_values, bounds = self.interval(self.target)
        rejecting = np.flatnonzero(bounds.max(axis=1, initial=-1) >= 0)
        return float(z_values[rejecting[-1]]) if rejecting.size else float(self.z[self.target])

    @functools.lru_cache(maxsize=None)  # noqa: B019 (the family lives as long as its certifier)
    def interval(self, level: int) -> tuple[np.ndarray, np.ndarray]:
        """The dense tests above grid ``level`` and below the next: their z and bounds [tests, looks], nested; kept
        on disk per design and level (:mod:`.table_cache`)."""
        z_values = self._z_values(level)

        def check(tables: tuple[np.ndarray, ...]) -> bool:
            return len(tables) == 1 and self._nested(level, tables[0], len(z_values))

        design = {"looks": self.looks, "z": self.z.tolist(), "failures": self.failures.tolist(),
                  "rhos": self.rhos.tolist(), "caps": self.caps.tolist(), "target": self.target, "alpha": self.alpha}
        (bounds,) = cached_tables("radius family interval", lambda: (self._bounds(level, z_values),), check,
                                  step=Z_STEP, level=level, **design)
        return np.array(z_values), bounds

    def _z_values(self, level: int) -> list[float]:
        """The dense grid strictly between grid ``level`` and the next (above the top: up to the cap's reach)."""
        end = self.top_z if level == self.target else float(self.z[level + 1])
        steps = math.ceil((end - float(self.z[level])) / Z_STEP) - 1
        return [float(self.z[level]) + i * Z_STEP for i in range(1, steps + 1)]

    def _bounds(self, level: int, z_values: list[float]) -> np.ndarray:
        """The calibrated, nested bounds of the tests at ``z_values`` above grid ``level`` (see :meth:`interval`)."""
        top = level == self.target
        above = None if top else self.failures[level + 1]
        cap = int(self.caps[level + 1] if not top else self.caps[level])
        rho = float(self.rhos[level] if top or np.isnan(self.rhos[level + 1]) else self.rhos[level + 1])
        rows, ceiling = [], self.failures[level]
        for z in z_values:
            row = self._row(z, cap, rho, ceiling) if reachable(cap, self.alpha, z) else np.full(len(self.looks), -1)
            if above is not None and np.any(row < above):
                row = above  # and every test after it in the interval: nested between the two levels
            rows.append(row)
            ceiling = row
        return np.array(rows, dtype=np.int64).reshape(len(rows), len(self.looks))

    def _nested(self, level: int, bounds: np.ndarray, tests: int) -> bool:
        """Whether ``bounds`` read back has the shape and structure of :meth:`_bounds`: within [-1, look], each test's
        bounds at most the one's below it (the first's at most grid ``level``'s) and at least the next level's."""
        looks = np.array(self.looks)
        if bounds.dtype != np.int64 or bounds.shape != (tests, len(looks)):
            return False
        below = np.vstack([self.failures[level][None, :], bounds])
        above = -1 if level == self.target else self.failures[level + 1]
        return bool(np.all(bounds >= -1) and np.all(bounds <= looks) and np.all(np.diff(below, axis=0) <= 0)
                    and np.all(bounds >= above))

    def _row(self, z: float, cap: int, rho: float, ceiling: np.ndarray) -> np.ndarray:
        """The calibrated bounds of the test at z (to ``cap``, at most ``ceiling``); past a lower cap below the top
        level's, every look counts as rejecting (the image went on only after the levels below the top did)."""
        row = spending_bounds(self.looks, z, self.alpha, cap, rho, ceiling)
        beyond = np.array(self.looks) > cap
        row[beyond] = np.array(self.looks)[beyond]
        return row
