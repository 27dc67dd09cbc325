"""The statistics of Cohen et al.'s CERTIFY and PREDICT: quantiles from ``scipy.special`` (``betaincinv`` and
``ndtri``, behind ``beta.ppf`` and ``norm.ppf``; ``scipy.stats`` is imported on first use only). Below alpha =
1e-100, where ``betaincinv`` underflows, the bound is solved in log space instead (docs/certify.md)."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import betaincinv, gammaln, ndtri

LOG_SPACE_BELOW = 1e-100  # alpha below which Clopper-Pearson bounds are solved in log space
MAX_TERMS = 10 ** 7  # binomial terms summed per tail at most (more: the tail counts as above alpha)


def lower_confidence_bounds(n_a: np.ndarray | int, n: np.ndarray | int, alpha: float) -> np.ndarray:
    """:func:`lower_confidence_bound` over arrays of counts n_a >= 1 (broadcast with n)."""
    bounds: np.ndarray = (betaincinv(n_a, n - n_a + 1, alpha) if alpha >= LOG_SPACE_BELOW
                          else np.vectorize(_log_space_bound, otypes=[float])(n_a, n, alpha))
    return bounds


def lower_confidence_bound(n_a: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound on p from n_a successes in n: the alpha-quantile
    of Beta(n_a, n - n_a + 1), and 0 when n_a = 0."""
    return 0.0 if n_a == 0 else float(lower_confidence_bounds(n_a, n, alpha))


def _log_space_bound(n_a: int, n: int, alpha: float) -> float:
    """The largest x (bisection to adjacent doubles) with P(Binomial(n, x) >= n_a) <= alpha, less a slack
    in log space above the rounding of the log-gamma sums, so that the bound errs only low."""
    if alpha <= 0:
        return 0.0
    log_alpha = math.log(alpha) - 1e-9 - 1e-14 * n * math.log(n + 1)
    lo, hi = 0.0, n_a / n  # the tail is 0 at lo, >= 1/2 at hi (n_a is then the median)
    for _ in range(1100):
        mid = (lo + hi) / 2
        if not lo < mid < hi:
            break
        lo, hi = (mid, hi) if _tail_at_most(n_a, n, mid, log_alpha) else (lo, mid)
    return lo


def _tail_at_most(k: int, n: int, x: float, log_alpha: float) -> bool:
    """Whether P(X >= k) <= exp(log_alpha), X ~ Binomial(n, x), 0 < x < k / n ("no" where unsure). The terms from k
    on decrease at least geometrically (ratio r): those after the kept ones sum to at most the first / (1 - r)."""
    log_x, log_y = math.log(x), math.log1p(-x)

    def log_terms(i: np.ndarray) -> np.ndarray:
        terms: np.ndarray = gammaln(n + 1) - gammaln(i + 1) - gammaln(n - i + 1) + i * log_x + (n - i) * log_y
        return terms

    ratio = (n - k) / (k + 1) * x / (1 - x)
    kept = n - k + 1 if ratio == 0 else min(n - k + 1, math.ceil(60 / -math.log(ratio)))
    if log_terms(np.array(k)) > log_alpha or kept > MAX_TERMS:
        return False
    terms = log_terms(np.arange(k, k + kept))
    if k + kept <= n:
        terms = np.append(terms, log_terms(np.array(k + kept)) - math.log1p(-ratio))
    top = float(terms.max())
    return top + math.log(float(np.exp(terms - top).sum())) <= log_alpha


def radius(p_a_lower: float, sigma: float) -> float:
    """The certified L2 radius sigma * Phi^-1(pA_lower) (meaningful for pA_lower >= 1/2)."""
    return float(sigma * ndtri(p_a_lower))


def max_radius(n: int, alpha: float, sigma: float) -> float:
    """The largest radius n samples can certify: every sample votes for the top class."""
    return radius(alpha ** (1.0 / n), sigma)


def top_two_pvalue(count1: int, count2: int) -> float:
    """Two-sided binomial test of count1 out of n = count1 + count2 at p = 1/2: the outcomes no likelier than count1
    are the tails beyond m = min(count1, count2), so the p-value is P(X <= m) + P(X >= n - m), as binomtest's."""
    from scipy.stats import binom

    n, m = count1 + count2, min(count1, count2)
    if 2 * m >= n:  # a tie, or no samples: every outcome is as likely
        return 1.0
    return min(1.0, float(binom.cdf(m, n, 0.5) + binom.sf(n - m - 1, n, 0.5)))
