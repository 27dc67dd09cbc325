// The statistics of Cohen et al.'s CERTIFY and PREDICT, without external libraries.
// Each function matches the SciPy expression named in its comment (tests compare them).
#pragma once

#include <cstdint>

namespace dmae_smooth {

// Phi^-1(p), scipy.stats.norm.ppf(p): about 1e-15 relative. -inf at 0, +inf at 1.
double normal_ppf(double p);

// Regularized incomplete beta I_x(a, b), scipy.special.betainc(a, b, x).
double incomplete_beta(double a, double b, double x);

// The p-quantile of Beta(a, b), scipy.stats.beta.ppf(p, a, b).
double beta_ppf(double p, double a, double b);

// One-sided (1 - alpha) Clopper-Pearson lower bound on p from n_a successes in n:
// beta.ppf(alpha, n_a, n - n_a + 1), and 0 when n_a = 0.
double clopper_pearson_lower(std::int64_t n_a, std::int64_t n, double alpha);

// Two-sided binomial test of k successes in n at p = 1/2:
// scipy.stats.binomtest(k, n, 0.5).pvalue (1 when n = 0).
double binomial_test_pvalue(std::int64_t k, std::int64_t n);

}  // namespace dmae_smooth
