"""Group-sequential CERTIFY: the exact DP against brute force, the exact false-certificate
probability of the calibrated boundaries, validity by simulation, futility, caching and errors.

A certificate fails when it claims a grid radius r with Phi(r / sigma) >= p_c for the claimed
class c (r = 0: p_c <= 1/2): the hypothesis it rejected was true.
"""

import math

import numpy as np
import pytest
from scipy.stats import norm

from dmae_fast.base.errors import UserError
from dmae_fast.stats import boundary_dp as dp
from dmae_fast.stats import group_sequential as gs
from dmae_fast.stats.boundary_dp import boundary_table, fixed_n_failures
from dmae_fast.stats.decisions import ABSTAIN
from dmae_fast.stats.group_sequential import (
    GroupSequentialCertifier,
    GroupSequentialConfig,
    default_looks,
)
from dmae_fast.stats.sequential import lower_bounds
from dmae_fast.stats.sequential_radius import Z_STEP
from dmae_fast.stats.settings import PAPER_RADII

N0, SIGMAS = 100, (0.25, 0.5, 1.0)
TRIALS, SIM_ALPHA = 100_000, 0.01


def crossing_probabilities(looks: tuple[int, ...], failure_bounds: np.ndarray, q: float) -> np.ndarray:
    """P(first rejection at look k) for each k at failure probability q = 1 - p, by the package's DP evaluating the
    given bounds (F_k <= failure_bounds[k])."""
    return dp._dp(tuple(looks), q, bounds=np.asarray(failure_bounds))[1]


def certifier(sigma: float, n: int, alpha: float = 0.001, **options) -> GroupSequentialCertifier:
    """The grid test (``grow`` off unless given: these tests are of its boundaries and stops)."""
    settings = {"radii": PAPER_RADII, "grow": math.inf, **options}
    return GroupSequentialCertifier(GroupSequentialConfig(N0, n, alpha, sigma, **settings))


def brute_force(looks: tuple[int, ...], bounds: np.ndarray, q: float) -> np.ndarray:
    """P(first rejection at look k), summing over all 2**cap failure patterns."""
    cap = looks[-1]
    fails = (np.arange(2 ** cap)[:, None] >> np.arange(cap)) & 1
    total = fails.sum(1)
    weight = q ** total * (1 - q) ** (cap - total)
    rejected = np.stack([fails[:, :look].sum(1) <= d for look, d in zip(looks, bounds)], 1)
    first = np.where(rejected.any(1), rejected.argmax(1), -1)
    return np.array([weight[first == k].sum() for k in range(len(looks))])


# (a) the DP equals brute-force enumeration of every path.
@pytest.mark.parametrize("looks,bounds", [((4, 8, 12), (0, 2, 4)), ((3, 7, 12, 16), (-1, 1, 3, 6)),
                                          ((5, 10, 15, 20), (0, 2, 4, 7)), ((2, 4, 6, 8, 10, 12, 14, 16), (0,) * 8)])
@pytest.mark.parametrize("q", [0.5, 0.3, 0.05])
def test_dp_equals_brute_force(looks, bounds, q):
    exact = brute_force(looks, np.array(bounds), q)
    assert np.allclose(crossing_probabilities(looks, np.array(bounds), q), exact, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("alpha,q", [(0.05, 0.5), (0.05, 0.2), (0.2, 0.3)])
def test_calibrated_bounds_are_exact_and_maximal(alpha, q):
    looks, rho = (4, 8, 12, 16), 1.0
    table, _ = boundary_table(looks, (float(norm.isf(q)),), alpha, (16,), (rho,), 0.0)
    bounds = table[0]
    assert bounds[-1] >= 0
    spent = np.cumsum(brute_force(looks, bounds, q))
    planned = alpha * (np.array(looks) / 16) ** rho
    assert np.all(spent <= planned + 1e-15)
    for k in range(len(looks)):  # one more failure allowed at look k overspends its plan
        looser = bounds.copy()
        looser[k] += 1
        assert np.cumsum(brute_force(looks, looser, q))[k] > planned[k] * (1 - dp.MARGIN)


def test_fft_dp_matches_direct_convolution(monkeypatch):
    looks = default_looks(10_000)
    bounds = certifier(1.0, 10_000).failures[0]
    fast = crossing_probabilities(looks, bounds, 0.5)
    monkeypatch.setattr(dp, "DIRECT", 10 ** 9)
    assert np.abs(fast - crossing_probabilities(looks, bounds, 0.5)).sum() < 1e-13


# (b) the exact false-certificate probability, at the threshold and just below it.
@pytest.mark.parametrize("n", [10_000, 30_000, 100_000])
@pytest.mark.parametrize("sigma", SIGMAS)
def test_exact_false_certificate_probability(sigma, n):
    c = certifier(sigma, n)
    worst = 0.0
    for j in range(c.target + 1):
        z = c.level_radii[j] / sigma
        at, below = (crossing_probabilities(c.looks, c.failures[j], norm.sf(v)).sum() for v in (z, z - 0.01))
        assert below <= at <= 0.001, (j, at, below)
        worst = max(worst, at)
    assert worst > 0.00095  # the DP spends (nearly) all of alpha
    print(f"sigma {sigma} cap {n}: max exact false-certificate probability {worst:.6g}")


def test_lower_cap_tables_are_exact():
    c = certifier(1.0, 100_000, lower_cap=10_000)
    table, _ = boundary_table(c.looks, tuple(c.level_radii / 1.0), 0.001, tuple(int(v) for v in c.caps),
                              gs.SPENDING, gs.FINAL_SHIFT)
    for j in range(c.target + 1):
        assert crossing_probabilities(c.looks, table[j], norm.sf(c.level_radii[j])).sum() <= 0.001
    beyond = np.array(c.looks) > 10_000
    assert np.all(table[:c.target, beyond] == -1) and np.all(c.failures[:c.target, beyond] == np.array(c.looks)[beyond])


@pytest.mark.parametrize("n", [10_000, 30_000, 100_000])
@pytest.mark.parametrize("sigma", SIGMAS)
def test_boundaries_monotone_and_close_to_fixed_n(sigma, n):
    c = certifier(sigma, n)
    d = c.failures
    assert np.all(np.diff(d, axis=0) <= 0) and np.all(np.diff(d, axis=1) >= 0)
    for j in range(c.target + 1):  # the last look certifies what fixed-n CP certifies 0.01 sigma further out
        z = c.level_radii[j] / sigma
        assert fixed_n_failures(n, 0.001, z + gs.FINAL_SHIFT) <= d[j, -1] <= fixed_n_failures(n, 0.001, z)
    assert np.all(d[c.target + 1:] == -1)


# (c) + (d) validity by simulation at each threshold; the naive procedure fails the same check.
def oracle(rng: np.random.Generator, p: float, looks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(p of the selected class, its votes among the first looks[k] estimation samples [K, TRIALS])."""
    picks_a = 2 * rng.binomial(N0, p, TRIALS) >= N0
    p_claimed = np.where(picks_a, p, 1 - p)
    return p_claimed, np.cumsum(rng.binomial(np.diff((0, *looks))[:, None], p_claimed), axis=0)


def radii(c: GroupSequentialCertifier, stopped: np.ndarray, n_a: np.ndarray) -> np.ndarray:
    """The certified radius of each image (-1: abstain) from where it stopped."""
    out = np.empty(n_a.shape)
    for k in np.unique(stopped):
        out[stopped == k] = c.certified_radius(k, n_a[stopped == k])
    return out


def failure_rate(radius: np.ndarray, p_claimed: np.ndarray, sigma: float) -> float:
    return float(np.mean((radius >= 0) & (norm.cdf(np.maximum(radius, 0) / sigma) >= p_claimed)))


def naive_radius(c: GroupSequentialCertifier, counts: np.ndarray, alpha: float) -> np.ndarray:
    """INVALID: Clopper-Pearson at alpha at every look, stop at the first look that certifies."""
    bounds = lower_bounds(counts, np.array(c.looks)[:, None], alpha)
    certified = bounds >= 0.5
    stop = np.where(certified.any(0), certified.argmax(0), len(c.looks) - 1)
    best = bounds[stop, np.arange(counts.shape[1])]
    level = np.searchsorted(c.thresholds, best, side="right") - 1  # the largest grid radius below the bound
    return np.where(level >= 0, c.level_radii[np.maximum(level, 0)], -1.0)


SIM_CASES = [(s, n, cap) for s in SIGMAS for n, cap in ((10_000, None), (3_000, 1_000))]


@pytest.mark.parametrize("sigma,n,lower_cap", SIM_CASES)
def test_simulated_false_certificates_at_each_threshold(sigma, n, lower_cap):
    c = certifier(sigma, n, SIM_ALPHA, lower_cap=lower_cap)
    limit = SIM_ALPHA + 3 * np.sqrt(SIM_ALPHA * (1 - SIM_ALPHA) / TRIALS)
    rng = np.random.default_rng([int(100 * sigma), n])
    rates, naive = [], []
    for j in range(c.target + 1):
        p_claimed, counts = oracle(rng, c.thresholds[j], c.looks)
        rates.append(failure_rate(radii(c, *c.run(counts)), p_claimed, sigma))
        naive.append(failure_rate(naive_radius(c, counts, SIM_ALPHA), p_claimed, sigma))
    print(f"sigma {sigma} cap {n} lower_cap {lower_cap}: rates {np.round(rates, 5)}, naive {np.round(naive, 4)}")
    assert max(rates) <= limit, rates
    assert naive[0] > limit  # the same check rejects CP at alpha at every look


# (e) futility only decides when to stop.
@pytest.mark.parametrize("sigma", SIGMAS)
def test_futility_never_certifies_more(sigma):
    rng = np.random.default_rng(7)
    c = {mode: certifier(sigma, 10_000, futility=mode) for mode in ("none", "deterministic", "upper")}
    looks = c["none"].looks
    p = rng.uniform(0.3, 1.0, 20_000)
    counts = np.cumsum(rng.binomial(np.diff((0, *looks))[:, None], p), axis=0)
    best = np.max([c["none"].certified_radius(k, counts[k]) for k in range(len(looks))], axis=0)
    radius, stops = {}, {}
    for mode, cert in c.items():
        stops[mode], n_a = cert.run(counts)
        radius[mode] = radii(cert, stops[mode], n_a)
        assert np.all(radius[mode] <= best)  # never above what the boundaries establish on the path
    assert np.all(stops["deterministic"] <= stops["none"]) and np.all(stops["upper"] <= stops["deterministic"])
    assert np.all(radius["deterministic"] >= radius["none"])  # it stops only where nothing more can come
    assert stops["upper"].mean() < stops["none"].mean()


def test_futility_stop_abstains():
    c = certifier(1.0, 10_000)
    assert c.should_stop(0, 20)  # 20 of 100 for cA: hopeless
    cert = c.certify(np.array([60, 40]), 20, c.looks[0])
    assert cert.prediction == ABSTAIN and cert.radius == 0.0 and cert.p_a_lower == 0.0


# Interface.
def test_certificates_carry_the_continuous_radius_above_the_grid_level():
    c = certifier(0.5, 10_000)
    assert c.looks == default_looks(10_000) and c.looks[-1] == 10_000 and c.level == 0.001
    assert c.procedure.startswith("group-sequential-exact-K36-") and c.target_radius == 1.5
    cert = c.certify(np.array([3, 90, 7]), 10_000, 10_000)
    assert (cert.prediction, cert.n0, cert.n, cert.n_a) == (1, 100, 10_000, 10_000)
    assert c.certified_radius(len(c.looks) - 1, np.array([10_000]))[0] == 1.5  # the grid level
    z = cert.radius / 0.5  # on the dense grid above z = 3, below what 10,000 votes of 10,000 reach (3.199)
    assert 3.0 < z < 3.199 and round((z - 3.0) / Z_STEP, 9) % 1 == 0
    assert cert.p_a_lower == pytest.approx(norm.cdf(z), rel=1e-15)
    at_all = c.certify(np.array([90, 10]), 5_200, 10_000)
    assert (at_all.prediction, at_all.radius, at_all.p_a_lower) == (0, 0.0, 0.5)
    assert not c.should_stop(3, 400)  # all 400 votes for cA: keep going for 1.5 (3 sigma)
    with pytest.raises(UserError, match="not one of the looks"):
        c.certify(np.array([90, 10]), 50, 150)


def test_stop_when_the_top_radius_is_certified_and_decide():
    c = certifier(0.25, 10_000)
    k = int(np.argmax(c.failures[1] >= 0))  # the first look where 0.5 (2 sigma) can be certified
    assert c.certified_radius(k, c.looks[k]) == 0.5 and c.should_stop(k, c.looks[k])
    assert c.decide(0, np.array([[10, 90], [0, c.looks[k]]]), k)  # cA = class 1: all its votes
    assert not c.decide(0, np.array([[10, 90], [0, 100]]), 0)  # 100 of 100 do not reach 2 sigma yet


def test_lower_cap_stops_images_short_of_the_level_below_the_top():
    c = certifier(1.0, 100_000, lower_cap=10_000, futility="none")
    k = c.looks.index(10_000)
    below_top = int(10_000 - c.failures[c.target - 1, k])  # just rejects radius 2 at 10,000
    assert not c.should_stop(k, below_top) and c.should_stop(k, below_top - 1)
    assert c.certify(np.array([0, 9]), c.looks[k + 1] - 10 ** 4, c.looks[k + 1]).radius == 2.0


# (f) caching and errors (how long a table takes is dmae-bench's to say, not a test's).
def test_tables_are_cached():
    boundary_table.cache_clear()
    first = certifier(1.0, 100_000)
    again = certifier(1.0, 100_000)
    assert boundary_table.cache_info().hits >= 1 and np.array_equal(first.failures, again.failures)
    with pytest.raises(ValueError):
        boundary_table(first.looks, tuple(first.level_radii), 0.001, (100_000,) * 6, gs.SPENDING,
                       gs.FINAL_SHIFT)[0][0, 0] = 1  # the cached table is read-only


@pytest.mark.parametrize("options,message", [
    ({"n0": 0}, "n0 and n must be >= 1"), ({"alpha": 1.5}, "alpha must be in"), ({"sigma": 0.0}, "sigma"),
    ({"radii": ()}, "radii"), ({"radii": (0.5, -1.0)}, "radii"), ({"spending": ()}, "spending"),
    ({"spending": (0.0,)}, "spending"), ({"final_shift": -0.1}, "final_shift"),
    ({"futility": "maybe"}, "futility must be one of"), ({"futility_alpha": 0.0}, "futility_alpha"),
    ({"looks": (100, 50, 10_000)}, "strictly increasing"), ({"looks": (100, 5_000)}, "end at n=10000"),
    ({"looks": (100, 5_000, 10_000), "lower_cap": 1234}, "lower_cap must be one of the looks"),
    ({"lower_cap": 10_000}, "lower_cap must be one of the looks below n")])
def test_bad_configs_raise_one_clear_user_error(options, message):
    settings = {"n0": N0, "n": 10_000, "alpha": 0.001, "sigma": 0.5} | options
    with pytest.raises(UserError, match=message) as error:
        GroupSequentialConfig(**settings)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("sigma", [0.25, 1.0])
def test_the_default_radii_keep_alpha_in_simulation(sigma):
    """--sequential's default (0.25 steps to what 10,000 samples certify, the levels below the top one to 10,000)
    at a 30,000 cap: false certificates at each level's threshold stay within alpha (known p, 100,000 trials)."""
    from dmae_fast.stats.radii import LOWER_CAP, default_radii
    from dmae_fast.stats.sequential_procedure import sequential_certifier

    c = sequential_certifier(N0, 30_000, SIM_ALPHA, sigma)
    config = c.config
    assert config.resolved_radii() == default_radii(30_000, SIM_ALPHA, sigma)
    assert config.resolved_lower_cap() == LOWER_CAP
    limit = SIM_ALPHA + 3 * np.sqrt(SIM_ALPHA * (1 - SIM_ALPHA) / TRIALS)
    rng = np.random.default_rng([int(100 * sigma), 30_000])
    rates = [failure_rate(radii(c, *c.run(counts)), p, sigma)
             for p, counts in (oracle(rng, c.thresholds[j], c.looks) for j in range(c.target + 1))]
    assert max(rates) <= limit, rates


def test_the_default_radii_are_the_summary_tables_steps_up_to_what_10000_samples_certify():
    from dmae_fast.stats.radii import default_radii

    assert default_radii(100_000, 0.001, 0.25) == (0.25, 0.5, 0.75)  # the paper's grid left only 0.5
    assert default_radii(10_000, 0.001, 0.5) == (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
    assert default_radii(100_000, 0.001, 1.0) == tuple(0.25 * i for i in range(1, 13))  # to 3.0 (3.199 at 10,000)
    assert default_radii(200, 0.001, 0.25) == (0.25,)  # the first step even where 200 samples reach less


@pytest.mark.parametrize("test", ["exact", "bonferroni"])
@pytest.mark.parametrize("n", [10_000, 30_000])
def test_the_library_and_the_command_share_one_default_radii(test, n):
    """A config built without radii in Python tests the levels ``dmae-certify --sequential`` tests (the 0.25 steps,
    and for the exact test the lower cap), so the same settings give the same rows (issue 56, item 3)."""
    from dmae_fast.run.config import CertifyConfig
    from dmae_fast.stats.procedure import Procedure
    from dmae_fast.stats.sequential import SequentialCertifier, SequentialConfig

    config = CertifyConfig.from_settings(dict(engine="demo", data="demo", out="r.tsv", sigma=0.5, n0=N0, n=n,
                                              alpha=0.001, sequential=True, sequential_test=test))
    command = Procedure(config.procedure_spec()).certifier
    library = (GroupSequentialCertifier(GroupSequentialConfig(N0, n, 0.001, 0.5)) if test == "exact"
               else SequentialCertifier(SequentialConfig(N0, n, 0.001, 0.5)))
    assert tuple(library.level_radii) == tuple(command.level_radii) and library.looks == command.looks
    assert library.procedure == command.procedure and np.array_equal(library.caps, command.caps)
    counts = np.random.default_rng(n).binomial(library.looks[-1], 0.999, size=64)
    selection = np.zeros(2, dtype=np.int64)
    selection[0] = N0
    rows = [(library.certify(selection, int(k), library.looks[-1]), command.certify(selection, int(k),
                                                                                   library.looks[-1])) for k in counts]
    assert all(a == b for a, b in rows)
