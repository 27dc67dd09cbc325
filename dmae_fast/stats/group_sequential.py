"""Group-sequential CERTIFY on a grid of radii, calibrated exactly by dynamic programming.

After n0 selection samples pick the guess cA, estimation samples are drawn up to the cap n and the procedure may
stop at pre-planned looks L_1 < ... < L_K = n (cumulative estimation counts, fixed before any sample is seen). It
certifies *grid* radii only: levels j = 0 ("certified at all", threshold t_0 = 1/2) and each radius r_j of the grid
(t_j = Phi(r_j / sigma)), with the hypotheses H_j: p <= t_j, where p = P(f(x + eta) = cA). Level j is rejected at
look k when the failures (votes for another class) F_k = L_k - nA_k are at most d[j, k]; the certificate is the
largest grid radius r_J whose level and every level below it are rejected at the look where the image stops.

What is proven. Condition on the selection draw (independent of the estimation samples), so cA and
p are fixed and F_1 <= F_2 <= ... are the failure counts of one Bernoulli(1 - p) sequence.

1. Exact calibration. For each level j, :mod:`.boundary_dp` chooses d[j, :] look by look by dynamic programming
   over the binomial paths not rejected before look k, so that P_{t_j}(F_k <= d[j, k] for some k) <= alpha,
   exactly (up to floating-point rounding, kept below a relative 1e-6 margin; the tail mass the DP truncates
   counts as rejected). Below alpha = 1e-6 it convolves directly, without FFT, down to 1e-300 (smaller: refused). The
   cumulative rejection probability through look k is at most alpha * (L_k / cap) ** rho (power alpha-spending;
   what integer boundaries leave unspent carries forward, the last look gets all of alpha), each level taking
   the most aggressive rho of a fixed ladder whose last boundary still matches fixed-n Clopper-Pearson
   (:func:`~.boundary_dp.boundary_table`). The boundaries depend on the configuration only, never on data.
2. Monotonicity in p. Coupling the sequences at p' < p (a failure at p is a failure at p'), F_k at p' is at least
   F_k at p, so every path that crosses at p' crosses at p: P_p'(reject H_j) <= P_{t_j}(reject H_j) <= alpha
   for every p' <= t_j, and the DP bound at t_j is the worst case.
3. Fixed-sequence testing over nested hypotheses. H_0 ⊂ H_1 ⊂ ... (t_j increases), so if p <= t_J the first
   true hypothesis j* = min{j: p <= t_j} is <= J. Claiming radius r_J requires rejecting every level up to J at
   the stopping look tau, hence H_j*, hence (whatever tau is: targets, futility, the cap) F_k <= d[j*, k] for
   some k, which has probability <= alpha by 1-2. Each level is tested at the full alpha; no Bonferroni over
   radii or looks. Boundaries are made monotone (d[j, k] <= d[j - 1, k]), so the rejected levels are 0 .. J.
4. Claim. With probability >= 1 - alpha, p > t_J: then g(x) = cA and g is constant within sigma * Phi^-1(p) > r_J
   (Cohen et al.). The certificate reports radius r_J exactly and pA_lower = t_J (1/2 for "certified at all"), a
   valid (1 - alpha) lower bound on p; abstentions report pA_lower = 0 (nothing is proven).
5. Futility and ``grow`` cost no alpha: they only stop an image or let it go on (they never reject a level), and
   any stopping rule is covered by 3. With ``lower_cap``, the levels below the top reachable one are tested up to
   lower_cap only and an image continues past lower_cap only if they are all rejected there (``grow`` keeps an
   image only up to the cap of the next level it tests), so a certificate past it still rests on 1-3.

"Clopper-Pearson at alpha at every look" is not valid (:mod:`.sequential`; tests/test_group_sequential.py)."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from dmae_fast.base.errors import UserError
from dmae_fast.stats.boundary_dp import boundary_table
from dmae_fast.stats.decisions import ABSTAIN, Certificate
from dmae_fast.stats.radii import default_lower_cap, default_radii
from dmae_fast.stats.sequential import LookStopping, lower_bounds, min_counts, upper_bounds
from dmae_fast.stats.sequential_radius import Z_STEP, RadiusFamily
from dmae_fast.stats.settings import FUTILITY_MODES, SMALLEST_SEQUENTIAL_ALPHA

PROCEDURE = "group-sequential-exact"
STEP, DENSE, GROWTH = 100, 2_000, 1.1  # default looks: every STEP samples up to DENSE, then x GROWTH
SPENDING = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)  # spending exponents rho tried in order (see boundary_table)
GROW, GROW_PER = 0.1, 10_000  # the default ``grow``: z = radius / sigma per GROW_PER further samples
FINAL_SHIFT = 0.01  # a level's last bound may sit this far (in radius / sigma) beyond fixed-n CP at alpha


def default_looks(n: int) -> tuple[int, ...]:
    """Every STEP estimation samples up to DENSE, then growing by GROWTH (multiples of STEP), then n."""
    looks, look = [], STEP
    while look < n:
        looks.append(look)
        look = look + STEP if look < DENSE else STEP * math.ceil(look * GROWTH / STEP)
    return (*looks, n)


@dataclass(frozen=True)
class GroupSequentialConfig:
    """Parameters of group-sequential CERTIFY; ``looks=None`` means :meth:`resolved_looks`, ``radii=None``
    :meth:`resolved_radii` and ``lower_cap=None`` :meth:`resolved_lower_cap` (the command's defaults).

    ``n`` is the cap. ``spending``: the exponents rho tried for each level, most aggressive first; ``final_shift``:
    how far (radius / sigma) beyond fixed-n Clopper-Pearson a level's last boundary may sit (see
    :func:`boundary_table`). ``lower_cap`` (optional, a look) caps every level below the top reachable one.
    ``futility`` (it never certifies, so it costs no alpha): "none"; "deterministic" (stop when even all remaining
    votes for cA cannot reach the next level's last boundary); "upper" (also stop when the (1 - futility_alpha)
    Clopper-Pearson upper bound on p is below the rate of cA votes that boundary needs). ``grow``: an image the
    grid test would stop draws on while its continuous radius is expected to grow by more than ``grow`` in
    z = radius / sigma per GROW_PER further samples (inf: stop where the grid test stops); a stopping rule, so it
    costs no alpha either."""

    n0: int
    n: int
    alpha: float
    sigma: float
    radii: tuple[float, ...] | None = None
    looks: tuple[int, ...] | None = None
    spending: tuple[float, ...] = SPENDING
    final_shift: float = FINAL_SHIFT
    futility: str = "upper"
    futility_alpha: float = 0.01
    lower_cap: int | None = None
    grow: float = GROW

    def __post_init__(self) -> None:
        if self.n0 < 1 or self.n < 1:
            raise UserError(f"n0 and n must be >= 1 (got n0={self.n0}, n={self.n})")
        if not 0 < self.alpha < 1:
            raise UserError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.alpha < SMALLEST_SEQUENTIAL_ALPHA:  # the DP's underflow (a product <= 5e-324) << alpha * MARGIN
            raise UserError(f"alpha {self.alpha:g} is below {SMALLEST_SEQUENTIAL_ALPHA:g}, the smallest the exact "
                            "sequential test can calibrate in double precision; fixed-n CERTIFY takes it, the "
                            "Bonferroni sequential test down to about 1e-307")
        if not (self.sigma > 0 and math.isfinite(self.sigma)):
            raise UserError(f"sigma must be positive and finite, got {self.sigma}")
        if self.radii is not None and not (self.radii and all(math.isfinite(r) and r >= 0 for r in self.radii)):
            raise UserError(f"radii must be a non-empty tuple of finite radii >= 0, got {self.radii}")
        if not self.spending or not all(rho > 0 and math.isfinite(rho) for rho in self.spending):
            raise UserError(f"spending must be a non-empty tuple of positive, finite exponents, got {self.spending}")
        if not (self.final_shift >= 0 and math.isfinite(self.final_shift)):
            raise UserError(f"final_shift must be finite and >= 0, got {self.final_shift}")
        if self.futility not in FUTILITY_MODES:
            raise UserError(f"futility must be one of {FUTILITY_MODES}, got {self.futility!r}")
        if not 0 < self.futility_alpha < 1:
            raise UserError(f"futility_alpha must be in (0, 1), got {self.futility_alpha}")
        if not self.grow >= 0:
            raise UserError(f"grow must be >= 0 (inf: stop where the grid test stops), got {self.grow}")
        looks = self.resolved_looks()
        if looks[0] < 1 or any(b <= a for a, b in itertools.pairwise(looks)) or looks[-1] != self.n:
            raise UserError(f"looks must be positive, strictly increasing and end at n={self.n}, got {looks}")
        lower_cap = self.resolved_lower_cap()
        if lower_cap is not None and (lower_cap not in looks or lower_cap == self.n):
            raise UserError(f"lower_cap must be one of the looks below n={self.n}, got {lower_cap}")

    def resolved_radii(self) -> tuple[float, ...]:
        """``radii``, or :func:`~.radii.default_radii`."""
        return self.radii if self.radii is not None else default_radii(self.n, self.alpha, self.sigma)

    def resolved_lower_cap(self) -> int | None:
        """``lower_cap``; with the default radii and none given, :func:`~.radii.default_lower_cap`."""
        if self.lower_cap is not None or self.radii is not None:
            return self.lower_cap
        return default_lower_cap(self.n, self.looks)

    def resolved_looks(self) -> tuple[int, ...]:
        """``looks``, or :func:`default_looks` (with the lower cap added)."""
        if self.looks:
            return self.looks
        lower_cap = self.resolved_lower_cap()
        return tuple(sorted(set(default_looks(self.n)) | ({lower_cap} if lower_cap else set())))


class GroupSequentialCertifier(LookStopping):
    """Stopping decisions and certificates of group-sequential CERTIFY for one configuration: ``failures[j, k]``, the
    most failures at look k that reject level j (-1: none), and ``rhos[j]``, level j's spending exponent."""

    def __init__(self, config: GroupSequentialConfig) -> None:
        super().__init__(config.resolved_looks(), config.alpha, config.resolved_radii(), config.sigma, config.futility)
        self.config = config
        z = tuple(float(v) for v in self.level_radii / config.sigma)
        settings = (config.spending, config.final_shift)
        full, self.rhos = boundary_table(self.looks, z, config.alpha, (config.n,) * len(z), *settings)
        self.target = int(max(np.flatnonzero(full[:, -1] >= 0), default=0))
        self.caps = np.full(len(z), config.n)
        self.failures = full.copy()
        lower_cap = config.resolved_lower_cap()
        if lower_cap is not None and self.target > 0:
            self.caps[:self.target] = lower_cap
            table, self.rhos = boundary_table(self.looks, z, config.alpha, tuple(int(c) for c in self.caps), *settings)
            looks = np.array(self.looks)
            beyond = looks > lower_cap  # images here had levels < target rejected
            self.failures = table.copy()
            self.failures[:self.target, beyond] = looks[beyond]
        self.final = self.failures[np.arange(len(z)), [self.looks.index(c) for c in self.caps]]
        need = 1.0 - self.final / self.caps  # the rate of cA votes that just meets a level's last bound
        self.upper_need = np.stack([min_counts(upper_bounds, n, config.futility_alpha, need) for n in self.looks])
        self.radius_family = RadiusFamily(self.looks, np.array(z), self.failures, self.rhos, self.caps, self.target,
                                  config.alpha)
        self._grows: dict[int, np.ndarray] = {}  # per look, per n_a: whether drawing on pays (-1: not known yet)

    @property
    def procedure(self) -> str:
        """The ``procedure`` column of results made with this certifier: the name, the number of looks and a digest
        of the failure bounds, the radius family's step and ``grow`` (equal names certify and stop alike)."""
        family = f"continuous radius, step {Z_STEP}, grow {self.config.grow}".encode()
        digest = hashlib.sha256(np.ascontiguousarray(self.failures).tobytes() + family).hexdigest()[:8]
        return f"{PROCEDURE}-K{len(self.looks)}-{digest}"

    def stop(self, look: int, n_a: np.ndarray) -> np.ndarray:
        """The grid test's stops (:meth:`LookStopping.stop`), less those where the radius can still grow enough."""
        stop = super().stop(look, n_a)
        if math.isinf(self.config.grow) or look == len(self.looks) - 1:
            return stop
        flat, n_a = stop.reshape(-1), np.asarray(n_a).reshape(-1)  # a copy where stop is not C-contiguous
        flat[flat] = ~self._worth_growing(look, n_a[flat])
        return flat.reshape(stop.shape)

    def _worth_growing(self, look: int, n_a: np.ndarray) -> np.ndarray:
        """Whether, with n_a votes for cA at look ``look``, drawing on is worth it; kept per (look, n_a)."""
        known = self._grows.setdefault(look, np.full(self.looks[look] + 1, -1, dtype=np.int8))
        new = np.unique(n_a[known[n_a] < 0])
        if new.size:
            known[new] = self._expected_growth_pays(look, new)
        worth: np.ndarray = known[n_a] == 1
        return worth

    def _expected_growth_pays(self, look: int, n_a: np.ndarray) -> np.ndarray:
        """Whether some later look up to the horizon of the image's radius tests (the cap of the interval it is in)
        is expected to raise z = radius / sigma by more than ``grow`` per GROW_PER further samples: Clopper-Pearson's
        z there with the votes scaled from the rate so far, against Clopper-Pearson's z now."""
        now = self.looks[look]
        level = self.levels(look, n_a) - 1
        horizon = np.where(level < 0, now, self.caps[np.clip(level + 1, 0, self.target)])
        pays = np.zeros(n_a.size, dtype=bool)
        open_ = np.flatnonzero(horizon > now)
        later = np.array([m for m in self.looks[look + 1:] if m <= horizon.max(initial=now)])[:, None]
        if open_.size == 0 or later.size == 0:
            return pays
        a = n_a[open_]
        z_now = ndtri(np.maximum(lower_bounds(a, now, self.config.alpha), 0.5))
        z_later = ndtri(np.maximum(lower_bounds(np.floor(a * (later / now)).astype(np.int64), later,
                                                self.config.alpha), 0.5))
        gain = (later <= horizon[open_]) & (z_later - z_now > self.config.grow * (later - now) / GROW_PER)
        pays[open_] = gain.any(axis=0)
        return pays

    def levels(self, look: int, n_a: np.ndarray | int) -> np.ndarray:
        """How many levels n_a votes for cA reject at look ``look`` (0-based); minus 1: the certified level."""
        failures = self.looks[look] - np.asarray(n_a)
        rejected: np.ndarray = (failures[..., None] <= self.failures[:, look]).sum(-1)
        return rejected

    def certified_radius(self, look: int, n_a: np.ndarray) -> np.ndarray:
        """The certified grid radius at look ``look`` (-1 where nothing is certified), vectorized."""
        level = self.levels(look, n_a) - 1
        return np.where(level >= 0, self.level_radii[np.maximum(level, 0)], -1.0)

    def grid_radius(self, n_a: int, n: int) -> float:
        """The grid radius certified with n_a votes for cA in n estimation samples (a look); 0 when none is."""
        return max(float(self.certified_radius(self.looks.index(n), np.array([n_a]))[0]), 0.0)

    def _certificate(self, guess: int, n0: int, n_a: int, n: int) -> Certificate:
        """The grid level the test certified, and the radius of :mod:`.sequential_radius`'s limit (the level's
        own radius and threshold where no test above it rejects)."""
        look = self.looks.index(n)
        level = int(self.levels(look, n_a)) - 1
        if level < 0:
            return Certificate(ABSTAIN, 0.0, n0, n, n_a, 0.0)
        z = self.radius_family.limit_z(look, n - n_a, level)
        if z == self.radius_family.z[level]:
            return Certificate(guess, float(self.level_radii[level]), n0, n, n_a, float(self.thresholds[level]))
        return Certificate(guess, self.config.sigma * z, n0, n, n_a, float(ndtr(z)))
