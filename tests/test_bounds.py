"""CERTIFY/PREDICT statistics against SciPy, statsmodels and hand-computed values."""

import numpy as np
import pytest
from scipy.stats import beta, binomtest, norm
from statsmodels.stats.proportion import proportion_confint

from dmae_fast.stats.bounds import lower_confidence_bound, max_radius, radius, top_two_pvalue
from dmae_fast.stats.decisions import ABSTAIN, certify_from_counts, predict_from_counts

CASES = [(0, 1), (1, 1), (0, 100), (50, 100), (99, 100), (100, 100), (5000, 10_000),
         (9_990, 10_000), (10_000, 10_000), (0, 100_000), (77_777, 100_000), (100_000, 100_000)]


@pytest.mark.parametrize("n_a,n", CASES)
@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.05])
def test_lower_bound_is_the_beta_quantile_and_statsmodels(n_a, n, alpha):
    bound = lower_confidence_bound(n_a, n, alpha)
    expected = 0.0 if n_a == 0 else beta.ppf(alpha, n_a, n - n_a + 1)
    assert bound == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert bound == pytest.approx(proportion_confint(n_a, n, alpha=2 * alpha, method="beta")[0], rel=1e-9, abs=1e-12)


def test_lower_bound_all_successes_is_alpha_root():
    # P(all n successes | p) = p**n = alpha at the bound.
    assert lower_confidence_bound(10_000, 10_000, 0.001) == pytest.approx(0.001 ** (1 / 10_000), rel=1e-12)


@pytest.mark.parametrize("n,factor", [(10_000, 3.1986), (100_000, 3.8115)])
@pytest.mark.parametrize("sigma", [0.25, 0.5, 1.0])
def test_radius_cap(n, factor, sigma):
    assert max_radius(n, 0.001, sigma) == pytest.approx(factor * sigma, abs=1e-4 * sigma)
    everything = np.array([0, n, 0])
    cert = certify_from_counts(np.array([0, 100, 0]), everything, 0.001, sigma)
    assert cert.prediction == 1 and cert.radius == pytest.approx(max_radius(n, 0.001, sigma), rel=1e-12)


def test_certify_uses_the_selection_guess_not_the_estimation_argmax():
    # Selection says class 2; estimation counts are mostly class 0: nA is class 2's count.
    cert = certify_from_counts(np.array([10, 0, 90]), np.array([900, 0, 100]), 0.001, 0.5)
    assert cert.n_a == 100 and cert.prediction == ABSTAIN and cert.radius == 0.0


def test_certify_abstains_below_one_half_and_certifies_at_it():
    n = 1000
    n_a = next(k for k in range(n + 1) if lower_confidence_bound(k, n, 0.001) >= 0.5)
    below = certify_from_counts(np.array([100, 0]), np.array([n_a - 1, n - n_a + 1]), 0.001, 0.5)
    at = certify_from_counts(np.array([100, 0]), np.array([n_a, n - n_a]), 0.001, 0.5)
    assert below.prediction == ABSTAIN and below.radius == 0.0
    assert at.prediction == 0 and at.radius == pytest.approx(0.5 * norm.ppf(at.p_a_lower))
    assert at.radius >= 0


def test_radius_hand_value():
    # Phi^-1(0.975) = 1.959964
    assert radius(0.975, 0.5) == pytest.approx(0.979982, abs=1e-6)


@pytest.mark.parametrize("counts", [[60, 40, 0], [70, 30, 0], [0, 55, 45], [3, 90, 7], [500, 480, 20], [1, 0, 0]])
@pytest.mark.parametrize("alpha", [0.001, 0.05])
def test_predict_matches_binomial_test(counts, alpha):
    counts = np.array(counts)
    top = np.sort(counts)[::-1]
    pvalue = binomtest(int(top[0]), int(top[0] + top[1]), 0.5).pvalue
    result = predict_from_counts(counts, alpha)
    assert result.pvalue == pytest.approx(pvalue, rel=1e-12)
    assert result.prediction == (int(np.argmax(counts)) if pvalue <= alpha else ABSTAIN)


def test_top_two_pvalue_is_scipys_binomial_test():
    """The closed form at p = 1/2 gives binomtest's two-sided p-value (down to the denormal range,
    where binomtest's own tail sum rounds differently), ties and empty counts included."""
    rng = np.random.default_rng(0)
    ns = np.concatenate([np.arange(0, 60), rng.integers(60, 20_001, 300)])
    for n in ns:
        for k in {0, 1, n // 2, (n + 1) // 2, n - 1, n, *rng.integers(0, n + 1, 4)}:
            if not 0 <= k <= n:
                continue
            want = binomtest(int(k), int(n), 0.5).pvalue if n else 1.0
            assert top_two_pvalue(int(k), int(n - k)) == pytest.approx(want, rel=1e-12, abs=1e-300), (k, n)


def test_predict_hand_values():
    assert predict_from_counts(np.array([0, 30, 70]), 0.05).prediction == 2  # p = 7.85e-5
    assert predict_from_counts(np.array([52, 48, 0]), 0.05).prediction == ABSTAIN  # p = 0.76
    assert top_two_pvalue(10, 0) == pytest.approx(2 * 0.5**10)
