"""Opt-in sequential (early-stopping) CERTIFY with the same 1 - alpha guarantee, by a Bonferroni correction.

After n0 selection samples pick the guess cA, estimation samples are drawn in stages up to a cap n_max. At each of
K pre-planned looks L_1 < ... < L_K = n_max (cumulative estimation counts, fixed before any sample is seen) the
procedure may stop; it then certifies from the one-sided Clopper-Pearson lower bound B_k on the nA_k votes for cA
among the first L_k samples at level alpha / K, exactly as fixed-n CERTIFY does at alpha.

Why this is valid. Condition on the selection draw (independent of the estimation samples), so cA and
p = P(f(x + eta) = cA) are fixed. Each L_k is a constant, so P(B_k > p) <= alpha / K (exact CP coverage), and by
the union bound all K bounds are <= p together with probability >= 1 - alpha. On that event the bound at the
stopping look tau is <= p however tau depends on the counts (target reached, futility, ...), so Cohen et al.'s
argument applies unchanged: if B_tau >= 1/2 then g(x) = cA and g is constant within sigma * Phi^-1(B_tau). The
looks must not depend on the data; a stopping rule may.

"CP at alpha at every look" is not valid: stopping at the first look whose bound certifies errs when ANY of the K
bounds overshoots p, with probability up to about K * alpha (tests/test_sequential.py)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import betaincinv, ndtr

from dmae_fast.base.errors import UserError
from dmae_fast.stats.bounds import lower_confidence_bounds
from dmae_fast.stats.decisions import Certificate, bound_certificate
from dmae_fast.stats.radii import default_radii
from dmae_fast.stats.settings import FUTILITY_MODES

LAST_EARLY, EARLY_LOOKS, FIRST_LOOK = 0.65, 5, 5_000
BONFERRONI_NAME = "sequential-cp-bonferroni"  # the procedure column's prefix


def default_looks(n_max: int) -> tuple[int, ...]:
    """The default looks for a cap of n_max estimation samples: n_max and EARLY_LOOKS halvings of LAST_EARLY * n_max,
    more while the first is above FIRST_LOOK (10,000: 407, 813, 1625, 3250, 6500, 10000; bench/sequential_savings)."""
    early = [math.ceil(LAST_EARLY * n_max / 2 ** j) for j in range(EARLY_LOOKS)]
    while early[-1] > FIRST_LOOK:
        early.append(math.ceil(LAST_EARLY * n_max / 2 ** len(early)))
    return tuple(sorted({*early, n_max}))


@dataclass(frozen=True)
class SequentialConfig:
    """Parameters of sequential CERTIFY; ``looks=None`` means :func:`default_looks`, ``radii=None``
    :meth:`resolved_radii` (the command's default)."""

    n0: int
    n_max: int
    alpha: float
    sigma: float
    radii: tuple[float, ...] | None = None
    looks: tuple[int, ...] | None = None
    futility: str = "deterministic"
    futility_alpha: float = 0.01

    def __post_init__(self) -> None:
        if self.n0 < 1 or self.n_max < 1:
            raise UserError(f"n0 and n_max must be >= 1 (got n0={self.n0}, n_max={self.n_max})")
        if not 0 < self.alpha < 1:
            raise UserError(f"alpha must be in (0, 1), got {self.alpha}")
        if not self.sigma > 0:
            raise UserError(f"sigma must be positive, got {self.sigma}")
        if not all(np.isfinite(r) and r >= 0 for r in self.resolved_radii()):
            raise UserError(f"radii must be finite and >= 0, got {self.radii}")
        if self.futility not in FUTILITY_MODES:
            raise UserError(f"futility must be one of {FUTILITY_MODES}, got {self.futility!r}")
        if not 0 < self.futility_alpha < 1:
            raise UserError(f"futility_alpha must be in (0, 1), got {self.futility_alpha}")
        looks = self.looks
        if looks is not None and (not looks or looks[0] < 1 or looks[-1] != self.n_max
                                  or any(b <= a for a, b in itertools.pairwise(looks))):
            raise UserError(f"looks must be positive, strictly increasing and end at n_max={self.n_max}, got {looks}")

    def resolved_radii(self) -> tuple[float, ...]:
        """``radii``, or :func:`~.radii.default_radii`."""
        return self.radii if self.radii is not None else default_radii(self.n_max, self.alpha, self.sigma)


def lower_bounds(n_a: np.ndarray, n: np.ndarray | int, alpha: float) -> np.ndarray:
    """Vectorized :func:`~dmae_fast.stats.bounds.lower_confidence_bound`, once per distinct (n_a, n) pair."""
    n_a, n = np.broadcast_arrays(np.asarray(n_a, dtype=np.int64), np.asarray(n, dtype=np.int64))
    base = int(n.max(initial=0)) + 1
    keys, inverse = np.unique(n_a * base + n, return_inverse=True)
    k_a, k_n = keys // base, keys % base
    bound, some = np.zeros(keys.shape), k_a > 0
    bound[some] = lower_confidence_bounds(k_a[some], k_n[some], alpha)
    return bound[inverse].reshape(n_a.shape)


def upper_bounds(n_a: np.ndarray, n: np.ndarray | int, alpha: float) -> np.ndarray:
    """One-sided (1 - alpha) Clopper-Pearson upper bound on p (1 when n_a = n)."""
    n_a = np.asarray(n_a)
    bound = betaincinv(n_a + 1, np.maximum(n - n_a, 1), 1 - alpha)
    return np.where(n_a < n, bound, 1.0)


def min_counts(bound: Callable[[np.ndarray, int, float], np.ndarray], n: int, alpha: float,
               thresholds: np.ndarray) -> np.ndarray:
    """Smallest n_a in [0, n] with bound(n_a, n, alpha) >= each threshold, n + 1 if none (bisection: it increases)."""
    lo, hi = np.full(thresholds.shape, -1), np.full(thresholds.shape, n + 1)
    while np.any(active := hi - lo > 1):
        mid = (lo + hi) // 2
        ok = bound(np.clip(mid, 0, n), n, alpha) >= thresholds
        hi, lo = np.where(active & ok, mid, hi), np.where(active & ~ok, mid, lo)
    return hi


class LookStopping:
    """What every stopping rule over pre-planned ``looks`` (cumulative estimation counts, the last = the cap) shares:
    ``level_radii`` (0.0 and the radii of interest, increasing) with ``thresholds`` Phi(r / sigma). A subclass sets
    ``target`` (the top level certifiable at the cap), ``caps[j]`` (level j's last look), ``final[j]`` (the most
    failures at caps[j] that reach level j), ``upper_need[k, j]`` (the fewest cA votes at look k that "upper"
    futility lets go on toward level j) and gives ``levels`` and ``_certificate``."""

    target: int
    caps: np.ndarray
    final: np.ndarray
    upper_need: np.ndarray

    def __init__(self, looks: tuple[int, ...], level: float, radii: tuple[float, ...], sigma: float,
                 futility: str) -> None:
        self.looks, self.level, self.futility = looks, level, futility  # level: that of the bounds
        self.level_radii = np.unique(np.array((0.0, *radii)))
        self.thresholds = ndtr(self.level_radii / sigma)

    @property
    def target_radius(self) -> float:
        """The largest radius of interest certifiable at the cap (0.0: "certified at all")."""
        return float(self.level_radii[self.target])

    def levels(self, look: int, n_a: np.ndarray | int) -> np.ndarray:
        """How many levels n_a votes for cA reach at look ``look`` (0-based), vectorized."""
        raise NotImplementedError

    def stop(self, look: int, n_a: np.ndarray) -> np.ndarray:
        """Whether to stop after look ``look`` (0-based), vectorized over counts n_a of cA."""
        n_a = np.asarray(n_a)
        if look == len(self.looks) - 1:
            return np.ones(n_a.shape, dtype=bool)
        reached = self.levels(look, n_a)
        following = np.minimum(reached, self.target)  # the next level, while below the target
        stop: np.ndarray = (reached > self.target) | (self.caps[following] <= self.looks[look])
        if self.futility != "none":  # too many failures even if every remaining sample votes cA
            stop |= self.looks[look] - n_a > self.final[following]
        if self.futility == "upper":
            stop |= n_a < self.upper_need[look, following]
        return stop

    def should_stop(self, look: int, n_a: int) -> bool:
        """Whether to stop after look ``look`` (0-based) with n_a votes for cA so far."""
        return bool(self.stop(look, np.asarray(n_a)))

    def decide(self, index: int, counts: np.ndarray, look: int) -> bool:
        """A :data:`~dmae_fast.stats.plan.Decide` callback: counts[0] selection, counts[1] estimation."""
        return self.should_stop(look, int(counts[1, np.argmax(counts[0])]))

    def run(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Stop many images at once (counts[k, i]: cA votes in image i's first looks[k]): (stopping look, n_a there)."""
        stopped = np.full(counts.shape[1], len(self.looks) - 1)
        active = np.ones(counts.shape[1], dtype=bool)
        for look in range(len(self.looks) - 1):
            now = active & self.stop(look, counts[look])
            stopped[now] = look
            active &= ~now
        return stopped, counts[stopped, np.arange(counts.shape[1])]

    def certify(self, selection_counts: np.ndarray, n_a: int, n_used: int) -> Certificate:
        """The certificate after stopping with n_a votes for cA in n_used estimation samples (a look)."""
        if n_used not in self.looks:
            raise UserError(f"n_used={n_used} is not one of the looks {self.looks}")
        return self._certificate(int(np.argmax(selection_counts)), int(np.sum(selection_counts)), int(n_a), n_used)

    def _certificate(self, guess: int, n0: int, n_a: int, n: int) -> Certificate:
        raise NotImplementedError


class SequentialCertifier(LookStopping):
    """Stopping decisions and certificates of Bonferroni sequential CERTIFY for one configuration; ``need[k, j]``:
    the fewest votes for cA at look k whose bound reaches level j's threshold."""

    def __init__(self, config: SequentialConfig) -> None:
        looks = config.looks or default_looks(config.n_max)
        super().__init__(looks, config.alpha / len(looks), config.resolved_radii(), config.sigma, config.futility)
        self.config = config
        if self.level < np.finfo(float).tiny:  # a subnormal alpha / K may round up by far more than 1e-16 relative
            raise UserError(f"alpha {config.alpha:g} over {len(self.looks)} looks is below the smallest normal double "
                            f"({np.finfo(float).tiny:g}) for the Bonferroni sequential test; fixed-n CERTIFY takes it")
        self.need = np.stack([min_counts(lower_bounds, n, self.level, self.thresholds) for n in self.looks])
        self.upper_need = np.stack([min_counts(upper_bounds, n, config.futility_alpha, self.thresholds)
                                    for n in self.looks])
        self.caps, self.final = np.full(len(self.level_radii), config.n_max), config.n_max - self.need[-1]
        self.target = int(max(np.flatnonzero(self.final >= 0), default=0))

    @property
    def procedure(self) -> str:
        """The ``procedure`` column of results made with this certifier."""
        return f"{BONFERRONI_NAME}-K{len(self.looks)}"

    def levels(self, look: int, n_a: np.ndarray | int) -> np.ndarray:
        reached: np.ndarray = (np.asarray(n_a)[..., None] >= self.need[look]).sum(-1)
        return reached

    def _certificate(self, guess: int, n0: int, n_a: int, n: int) -> Certificate:
        return bound_certificate(guess, n0, n_a, n, self.level, self.config.sigma)
