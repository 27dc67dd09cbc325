"""The statistics of Cohen et al.'s CERTIFY and PREDICT, each a one-liner over SciPy."""

from __future__ import annotations

from scipy.stats import beta, binomtest, norm


def lower_confidence_bound(n_a: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound on p from n_a successes in n.

    The alpha-quantile of Beta(n_a, n - n_a + 1), and 0 when n_a = 0.
    """
    return 0.0 if n_a == 0 else float(beta.ppf(alpha, n_a, n - n_a + 1))


def radius(p_a_lower: float, sigma: float) -> float:
    """The certified L2 radius sigma * Phi^-1(pA_lower) (meaningful for pA_lower >= 1/2)."""
    return float(sigma * norm.ppf(p_a_lower))


def max_radius(n: int, alpha: float, sigma: float) -> float:
    """The largest radius n samples can certify: every sample votes for the top class."""
    return radius(alpha ** (1.0 / n), sigma)


def top_two_pvalue(count1: int, count2: int) -> float:
    """Two-sided binomial test of count1 out of count1 + count2 at p = 1/2."""
    return float(binomtest(count1, count1 + count2, 0.5).pvalue) if count1 + count2 else 1.0
