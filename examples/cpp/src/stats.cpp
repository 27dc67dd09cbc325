#include "dmae_smooth/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dmae_smooth {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kEps = std::numeric_limits<double>::epsilon();
constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kSqrt2Pi = 2.50662827463100050242;

// Acklam's rational approximation of Phi^-1 on (0, 1/2] (relative error < 1.2e-9).
double acklam_lower(double q) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  if (q < 0.02425) {
    const double t = std::sqrt(-2.0 * std::log(q));
    return (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) /
           ((((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1.0);
  }
  const double r = q - 0.5, s = r * r;
  return (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5]) * r /
         (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1.0);
}

// Phi^-1(q) for q in (0, 1/2]: Acklam's start, then Halley steps on Phi(x) = erfc(-x/sqrt2)/2,
// which is accurate in relative terms for x <= 0.
double lower_ppf(double q) {
  double x = acklam_lower(q);
  for (int step = 0; step < 2; ++step) {
    const double density = std::exp(-0.5 * x * x) / kSqrt2Pi;
    if (density == 0.0) break;  // q below ~1e-300: the start is as good as it gets
    const double u = (0.5 * std::erfc(-x / kSqrt2) - q) / density;
    x -= u / (1.0 + 0.5 * x * u);
  }
  return x;
}

double log_beta(double a, double b) { return std::lgamma(a) + std::lgamma(b) - std::lgamma(a + b); }

// Continued fraction of I_x(a, b) * a * B(a, b) / (x^a (1-x)^b), modified Lentz; converges
// fast for x < (a + 1) / (a + b + 2). Terms: d(2m+1) = -(a+m)(a+b+m)x / ((a+2m)(a+2m+1)),
// d(2m) = m(b-m)x / ((a+2m-1)(a+2m)).
double beta_fraction(double a, double b, double x) {
  constexpr double tiny = 1e-300;
  auto guard = [](double v) { return std::fabs(v) < tiny ? tiny : v; };
  double c = 1.0, d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0)), f = d;
  for (int m = 1; m < 1000000; ++m) {
    const double even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
    d = 1.0 / guard(1.0 + even * d);
    c = guard(1.0 + even / c);
    f *= c * d;
    const double odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
    d = 1.0 / guard(1.0 + odd * d);
    c = guard(1.0 + odd / c);
    f *= c * d;
    if (std::fabs(c * d - 1.0) < kEps) break;
  }
  return f;
}

// log of the Beta(a, b) density at x.
double log_beta_density(double a, double b, double x) {
  return (a - 1.0) * std::log(x) + (b - 1.0) * std::log1p(-x) - log_beta(a, b);
}

}  // namespace

double normal_ppf(double p) {
  if (std::isnan(p)) return p;
  if (p <= 0.0) return -kInf;
  if (p >= 1.0) return kInf;
  return p > 0.5 ? -lower_ppf(1.0 - p) : lower_ppf(p);  // 1 - p is exact for p > 1/2
}

double incomplete_beta(double a, double b, double x) {
  if (x <= 0.0) return 0.0;
  if (x >= 1.0) return 1.0;
  const double log_front = a * std::log(x) + b * std::log1p(-x) - log_beta(a, b);
  if (x < (a + 1.0) / (a + b + 2.0)) return std::exp(log_front) * beta_fraction(a, b, x) / a;
  return 1.0 - std::exp(log_front) * beta_fraction(b, a, 1.0 - x) / b;
}

double beta_ppf(double p, double a, double b) {
  if (p <= 0.0) return 0.0;
  if (p >= 1.0) return 1.0;
  if (b == 1.0) return std::exp(std::log(p) / a);          // I_x(a, 1) = x^a
  if (a == 1.0) return -std::expm1(std::log1p(-p) / b);    // I_x(1, b) = 1 - (1-x)^b
  // Start: a normal approximation, or the small-x power law I_x ~ x^a / (a B(a, b)).
  const double mean = a / (a + b), sd = std::sqrt(a * b / ((a + b) * (a + b) * (a + b + 1.0)));
  double x = mean + normal_ppf(p) * sd;
  if (!(x > 0.0 && x < 1.0)) x = std::min(0.5, std::exp((std::log(p * a) + log_beta(a, b)) / a));
  // Newton on I_x - p, kept inside a shrinking bracket (bisection when it would leave it).
  double lo = 0.0, hi = 1.0;
  for (int iteration = 0; iteration < 400; ++iteration) {
    const double error = incomplete_beta(a, b, x) - p;
    if (error == 0.0) return x;
    (error < 0.0 ? lo : hi) = x;
    double next = x - error / std::exp(log_beta_density(a, b, x));
    if (!(next > lo && next < hi)) next = 0.5 * (lo + hi);
    if (std::fabs(next - x) <= 4.0 * kEps * x || hi - lo <= 4.0 * kEps * x) return next;
    x = next;
  }
  return x;
}

double clopper_pearson_lower(std::int64_t n_a, std::int64_t n, double alpha) {
  if (n_a <= 0) return 0.0;
  return beta_ppf(alpha, static_cast<double>(n_a), static_cast<double>(n - n_a + 1));
}

double binomial_test_pvalue(std::int64_t k, std::int64_t n) {
  if (n <= 0 || 2 * k == n) return 1.0;
  // By symmetry at p = 1/2 both tails weigh P(X <= m), m = min(k, n - k), and
  // P(X <= m) = I_{1/2}(n - m, m + 1).
  const std::int64_t m = std::min(k, n - k);
  const double tail = incomplete_beta(static_cast<double>(n - m), static_cast<double>(m + 1), 0.5);
  return std::min(1.0, 2.0 * tail);
}

}  // namespace dmae_smooth
