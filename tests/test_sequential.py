"""Sequential CERTIFY: validity by simulation with a Bernoulli oracle, and unit tests.

The oracle's base classifier votes class A (index 0) with probability p and class B
otherwise. A trial fails when its certificate claims a class c with radius
> sigma * Phi^-1(p_c), or claims a class with p_c <= 1/2 at all. A valid procedure fails
with probability <= alpha; the tests allow alpha + 4 * sqrt(alpha / TRIALS).
"""

import numpy as np
import pytest
from scipy.stats import beta, norm

from dmae_fast.base.errors import UserError
from dmae_fast.stats.bounds import lower_confidence_bound
from dmae_fast.stats.decisions import ABSTAIN, certify_from_counts
from dmae_fast.stats.sequential import (
    SequentialCertifier,
    SequentialConfig,
    default_looks,
    lower_bounds,
)
from dmae_fast.stats.settings import FUTILITY_MODES, PAPER_RADII

TRIALS = 100_000
N0 = 100
FINE_RADII = tuple(0.25 * i for i in range(1, 17))
EIGHT_LOOKS = (8, 16, 32, 63, 125, 250, 500, 1000)
# (sigma, alpha, n_max, looks, radii): the paper's grid with the default looks, and a fine
# grid with eight looks.
SETTINGS = ([(s, a, n, None, PAPER_RADII) for s in (0.25, 0.5, 1.0) for a in (0.001, 0.01) for n in (1000, 10_000)]
            + [(s, a, 1000, EIGHT_LOOKS, FINE_RADII) for s in (0.25, 0.5, 1.0) for a in (0.001, 0.01)])


def margin(alpha: float) -> float:
    return alpha + 4 * np.sqrt(alpha / TRIALS)


def oracle(rng: np.random.Generator, p: float, looks: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(p of the selected class, votes for it among the first looks[k] samples [K, TRIALS])."""
    picks_a = 2 * rng.binomial(N0, p, TRIALS) >= N0  # np.argmax breaks ties to class A
    p_claimed = np.where(picks_a, p, 1 - p)
    counts = np.cumsum(rng.binomial(np.diff((0, *looks))[:, None], p_claimed), axis=0)
    return p_claimed, counts


def failure_rate(bound: np.ndarray, p_claimed: np.ndarray, sigma: float) -> float:
    """How often the certificate from ``bound`` (abstain below 1/2) claims too much."""
    with np.errstate(divide="ignore"):
        too_far = sigma * norm.ppf(bound) > sigma * norm.ppf(p_claimed)
    return float(np.mean((bound >= 0.5) & ((p_claimed <= 0.5) | too_far)))


def naive_bound(counts: np.ndarray, looks: tuple[int, ...], alpha: float) -> np.ndarray:
    """INVALID: CP at alpha at every look, stop at the first look that certifies anything,
    report the best bound over the looks seen."""
    bounds = lower_bounds(counts, np.array(looks)[:, None], alpha)
    certified = bounds >= 0.5
    stop = np.where(certified.any(0), certified.argmax(0), len(looks) - 1)
    return np.where(np.arange(len(looks))[:, None] <= stop, bounds, 0.0).max(0)


def threshold_probabilities(sigma: float, alpha: float, n_max: int, certifier: SequentialCertifier) -> list[float]:
    """p at the decision thresholds: 1/2 (either class), B favoured, pA_lower ~ 1/2 at n_max,
    and just above Phi(r / sigma) for the two largest radii certifiable at n_max."""
    z = norm.isf(certifier.level)
    radii = [r for r in certifier.level_radii[1:] if r <= certifier.target_radius][-2:]
    above = [norm.cdf(r / sigma) for r in radii]
    return [0.5, 0.45, 0.5 + 0.5 * z / np.sqrt(n_max)] + [t + 0.1 * np.sqrt(t * (1 - t) / n_max) for t in above]


def failure_rates(sigma: float, alpha: float, n_max: int, looks, radii, seed: int = 0) -> dict[str, list[float]]:
    """Failure rate of every procedure at every test probability."""
    certifiers = {mode: SequentialCertifier(SequentialConfig(N0, n_max, alpha, sigma, radii, looks, mode))
                  for mode in FUTILITY_MODES}
    looks = certifiers["none"].looks
    rng = np.random.default_rng([seed, int(1000 * sigma), int(1e6 * alpha), n_max, len(looks)])
    rates: dict[str, list[float]] = {}
    for p in threshold_probabilities(sigma, alpha, n_max, certifiers["none"]):
        p_claimed, counts = oracle(rng, p, looks)
        bounds = {"fixed-n": lower_bounds(counts[-1], n_max, alpha), "naive": naive_bound(counts, looks, alpha)}
        for mode, certifier in certifiers.items():
            stopped, n_a = certifier.run(counts)
            bounds[f"sequential-{mode}"] = lower_bounds(n_a, np.array(looks)[stopped], certifier.level)
        for name, bound in bounds.items():
            rates.setdefault(name, []).append(failure_rate(bound, p_claimed, sigma))
    return rates


@pytest.mark.parametrize("sigma,alpha,n_max,looks,radii", SETTINGS)
def test_fixed_and_sequential_are_valid(sigma, alpha, n_max, looks, radii):
    rates = failure_rates(sigma, alpha, n_max, looks, radii)
    for name, values in rates.items():
        if name != "naive":
            assert max(values) <= margin(alpha), (name, values)
    assert max(rates["naive"]) > margin(alpha)  # the same check rejects the invalid procedure


def test_naive_repeated_cp_at_alpha_is_rejected():
    # alpha = 0.01, eight looks, p = 1/2: every certificate is a failure.
    rates = failure_rates(0.5, 0.01, 1000, EIGHT_LOOKS, PAPER_RADII)
    assert rates["naive"][0] > 2 * margin(0.01)
    assert rates["sequential-none"][0] <= margin(0.01)


def test_stop_at_the_last_look_always():
    certifier = SequentialCertifier(SequentialConfig(N0, 1000, 0.001, 0.5, radii=PAPER_RADII, futility="none"))
    assert all(certifier.should_stop(len(certifier.looks) - 1, n_a) for n_a in (0, 500, 1000))


@pytest.mark.parametrize("mode", FUTILITY_MODES)
def test_stop_when_the_target_is_reached(mode):
    certifier = SequentialCertifier(SequentialConfig(N0, 10_000, 0.001, 0.25, radii=PAPER_RADII, futility=mode))
    assert certifier.looks[0] == 407 and certifier.target_radius == 0.5
    assert certifier.should_stop(0, 407)  # 407 of 407 certify 2 sigma at alpha / 6
    assert lower_confidence_bound(407, 407, certifier.level) >= norm.cdf(2)


def test_futility_modes():
    none, deterministic, upper = (SequentialCertifier(SequentialConfig(N0, 10_000, 0.001, 1.0, PAPER_RADII,
                                                                       futility=mode))
                                  for mode in FUTILITY_MODES)
    # 245 of 407 certify at all, and the 99% upper bound on pA is below Phi(0.5), the next
    # level: only "upper" gives up; all remaining votes for cA could still get there.
    assert lower_confidence_bound(245, 407, upper.level) >= 0.5
    assert beta.ppf(0.99, 246, 407 - 245) < norm.cdf(0.5)
    assert upper.should_stop(0, 245) and not deterministic.should_stop(0, 245) and not none.should_stop(0, 245)
    # No vote for cA in the first 6,500: 3,500 more cannot certify (5,180 are needed).
    assert deterministic.should_stop(4, 0) and upper.should_stop(4, 0) and not none.should_stop(4, 0)
    assert not deterministic.should_stop(3, 0)  # 6,750 more still could
    # All votes so far, but 3 sigma needs 6,441 at alpha / 6: keep going at 3,250.
    assert not any(c.should_stop(3, 3250) for c in (none, deterministic, upper))


@pytest.mark.parametrize("sigma,alpha,n_max", [(0.25, 0.001, 10_000), (0.5, 0.001, 10_000), (1.0, 0.001, 10_000),
                                               (1.0, 0.01, 1000), (0.5, 0.001, 100), (0.25, 0.001, 100)])
def test_target_radius(sigma, alpha, n_max):
    certifier = SequentialCertifier(SequentialConfig(N0, n_max, alpha, sigma, radii=PAPER_RADII))
    reach = sigma * norm.ppf((alpha / len(certifier.looks)) ** (1 / n_max))
    assert certifier.target_radius == max([r for r in PAPER_RADII if r <= reach], default=0.0)


def test_target_radii_at_the_paper_setting():
    radii = [SequentialCertifier(SequentialConfig(N0, 10_000, 0.001, s, radii=PAPER_RADII)).target_radius
             for s in (0.25, 0.5, 1.0)]
    assert radii == [0.5, 1.5, 3.0]


def test_certify_is_the_beta_quantile_at_alpha_over_k():
    certifier = SequentialCertifier(SequentialConfig(N0, 10_000, 0.001, 0.5, radii=PAPER_RADII))
    k = len(certifier.looks)
    cert = certifier.certify(np.array([3, 90, 7]), 3000, 3250)
    expected = beta.ppf(0.001 / k, 3000, 3250 - 3000 + 1)
    assert cert.p_a_lower == pytest.approx(expected, rel=1e-12)
    assert cert.prediction == 1 and cert.radius == pytest.approx(0.5 * norm.ppf(expected), rel=1e-12)
    assert (cert.n0, cert.n, cert.n_a) == (100, 3250, 3000)
    abstain = certifier.certify(np.array([3, 90, 7]), 1625, 3250)
    assert abstain.prediction == ABSTAIN and abstain.radius == 0.0
    with pytest.raises(UserError, match="not one of the looks"):
        certifier.certify(np.array([0, 100]), 10, 1000)


def test_decide_reads_the_selected_class_estimation_count():
    certifier = SequentialCertifier(SequentialConfig(N0, 10_000, 0.001, 0.25, radii=PAPER_RADII))
    assert certifier.decide(7, np.array([[10, 90], [0, 407]]), 0)  # class 1: 407 of 407
    assert not certifier.decide(7, np.array([[10, 90], [407, 0]]), 0)  # class 1: 0 of 407


def test_vectorized_bounds_match_the_scalar_ones_and_fixed_n_certify():
    n_a = np.array([0, 1, 499, 500, 9_990, 10_000])
    bounds = lower_bounds(n_a, 10_000, 0.001)
    assert bounds.tolist() == [lower_confidence_bound(int(a), 10_000, 0.001) for a in n_a]
    for a, bound in zip(n_a, bounds):
        cert = certify_from_counts(np.array([1, 99]), np.array([10_000 - a, a]), 0.001, 0.5)
        assert cert.p_a_lower == bound and (cert.prediction == 1) == (bound >= 0.5)


def test_decision_tables_match_the_bounds():
    certifier = SequentialCertifier(SequentialConfig(N0, 1000, 0.01, 0.5, radii=FINE_RADII))
    for look, n in enumerate(certifier.looks):
        bounds = lower_bounds(np.arange(n + 1), n, certifier.level)
        assert np.array_equal(certifier.need[look], np.searchsorted(bounds, certifier.thresholds))


def test_run_equals_should_stop_one_image_at_a_time():
    certifier = SequentialCertifier(SequentialConfig(N0, 1000, 0.01, 0.5, radii=PAPER_RADII, futility="upper"))
    _, counts = oracle(np.random.default_rng(3), 0.8, certifier.looks)
    counts = counts[:, :300]
    stopped, n_a = certifier.run(counts)
    for i in range(counts.shape[1]):
        look = next(k for k in range(len(certifier.looks)) if certifier.should_stop(k, int(counts[k, i])))
        assert (stopped[i], n_a[i]) == (look, counts[look, i])


@pytest.mark.parametrize("n_max", [1, 2, 10, 1000, 10_000, 100_000])
def test_default_looks(n_max):
    looks = default_looks(n_max)
    assert looks[-1] == n_max and looks[0] >= 1 and len(looks) <= 6
    assert all(b > a for a, b in zip(looks, looks[1:]))
    SequentialConfig(N0, n_max, 0.001, 0.5, radii=PAPER_RADII, looks=looks)


def test_default_looks_of_a_huge_cap_start_early():
    """Issue 39: --n 10^9 put the first look at 40.6 million samples. The K = 6 schedule stays for caps
    up to 123,076 (10,000: 407 .. 10,000); above, halvings go on until the first look is <= 5,000."""
    assert default_looks(10_000) == (407, 813, 1625, 3250, 6500, 10_000)
    assert default_looks(100_000) == (4063, 8125, 16_250, 32_500, 65_000, 100_000)
    assert len(default_looks(123_076)) == 6 and len(default_looks(123_077)) == 7
    looks = default_looks(10 ** 9)
    assert looks[0] == 4960 and len(looks) == 19 and looks[-2:] == (650_000_000, 10 ** 9)
    assert all(b <= 2 * a + 1 for a, b in zip(looks[:-2], looks[1:-1]))  # doubling, up to the rounding up
    certifier = SequentialCertifier(SequentialConfig(N0, 10 ** 9, 0.001, 0.25, radii=PAPER_RADII))
    assert certifier.procedure == "sequential-cp-bonferroni-K19" and certifier.target_radius == 1.0
    unanimous = next(look for k, look in enumerate(looks) if certifier.should_stop(k, look))
    assert unanimous == 317_383  # where all votes for cA certify 4 sigma at alpha / 19 (it was 40.6 million)


def test_procedure_names_the_bonferroni_split():
    config = SequentialConfig(N0, 10_000, 0.001, 0.5, radii=PAPER_RADII)
    assert SequentialCertifier(config).procedure == "sequential-cp-bonferroni-K6"


@pytest.mark.parametrize("change", [dict(n_max=0), dict(n0=0), dict(alpha=0.0), dict(alpha=1.0), dict(sigma=0.0),
                                    dict(radii=(0.5, -1.0)), dict(looks=(10, 10, 1000)), dict(looks=(0, 1000)),
                                    dict(looks=(500, 900)), dict(looks=()), dict(futility="maybe"),
                                    dict(futility_alpha=1.5)])
def test_config_validation(change):
    with pytest.raises(UserError):
        SequentialConfig(**{**dict(n0=N0, n_max=1000, alpha=0.001, sigma=0.5), **change})
