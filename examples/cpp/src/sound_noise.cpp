#include "dmae_smooth/sound_noise.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "dmae_smooth/error.h"
#include "dmae_smooth/npy.h"
#include "dmae_smooth/results.h"
#include "dmae_smooth/sha256.h"

#if LDBL_MANT_DIG < 113 && defined(__SIZEOF_FLOAT128__)
#include <quadmath.h>
#elif LDBL_MANT_DIG < 113
#error "dmae_smooth checks sound tables in 113-bit floating point: it needs a 113-bit long double or __float128 (libquadmath)"
#endif

namespace dmae_smooth {
namespace {

// 113-bit binary floating point, to check floor(2^64 Phi) exactly (long double's 64 bits cannot near Phi = 1/2).
#if LDBL_MANT_DIG >= 113
using Quad = long double;
Quad quad_erfc(Quad x) { return std::erfc(x); }
Quad quad_sqrt(Quad x) { return std::sqrt(x); }
#else
using Quad = __float128;
Quad quad_erfc(Quad x) { return erfcq(x); }
Quad quad_sqrt(Quad x) { return sqrtq(x); }
#endif

constexpr std::int64_t kMaxSum = std::int64_t{1} << 24;  // X + Z stays exact in float32 below this
constexpr long double kMinSteps = 1e-6L;                 // the smallest L * sigma (dmae_fast's table_problem)
constexpr double kTail = 0x1p-70;                        // the most P(|Z| > K) the truncation may cut
constexpr double kSlack = 1e-9;                          // relative, for P(|Z| > K) near the truncation's cut
constexpr double kTvSlack = 1e-6;                        // relative: how far above its thresholds' a stated tv may be
// The most error, in units of 2^-64, of y_k = 2^64 Phi((k + 1/2) / s) and of T_k - y_k as computed below.
// s = L * sigma is exact (24 + 53 bits) and z = (m + 1/2) / s / sqrt(2) relatively within 2^-111 (three roundings),
// which moves P_m = erfc(z) / 2 by < 2^-113 (|d/dz erfc(z) / 2| z = z e^-z^2 / sqrt(pi) < 1/4); erfc itself is
// within a few ulps (glibc's ldbl-128 erfc, libquadmath's erfcq: 1.3 measured), so with 16 ulps P_m <= 1/2 is
// within 2^-113 + 2^-109 < 2^-108; 2^64 P_m is exact, and T_k - y_k (below 2 where it matters) rounds by < 2^-111.
// T_k - y_k is thus within 2^-43: e = 2^-34 leaves a factor 512.
constexpr double kThresholdError = 0x1p-34;

double from_bits(std::int64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// SHA-256 of the words a table's digest covers (all but the four digest words), as four int64.
std::array<std::int64_t, 4> digest_words(const std::vector<std::int64_t>& words) {
  std::vector<std::int64_t> covered(words.begin(), words.begin() + 5);
  covered.insert(covered.end(), words.begin() + kSoundTableHeader, words.end());
  const std::array<std::uint8_t, 32> digest = sha256(covered.data(), covered.size() * sizeof(std::int64_t));
  std::array<std::int64_t, 4> out;
  std::memcpy(out.data(), digest.data(), digest.size());  // little-endian words, as read_npy's host
  return out;
}

// The checks that K, the thresholds and the total variation are those of the header's sigma and grid: "" when
// they are, else the problem. Sets table.tv_per_element to a true bound: the stated one or, if larger, the one
// recomputed from the thresholds.
std::string semantic_problem(SoundTable& table) {
  const Quad s = static_cast<Quad>(table.grid) * table.sigma, root2 = quad_sqrt(2), two64 = 0x1p64;
  const auto tail = [&](std::int64_t m) { return quad_erfc((m + static_cast<Quad>(0.5)) / s / root2) / 2; };  // P_m
  const std::string of = " of sigma " + format_repr(table.sigma) + " on the 1/" + std::to_string(table.grid) + " grid";
  const std::int64_t K = table.K;
  if (!(2 * tail(K) <= kTail * (1 + kSlack) && (K == 1 || 2 * tail(K - 1) > kTail * (1 - kSlack)))) {
    return "its K = " + std::to_string(K) + " is not the truncation" + of;
  }
  std::vector<Quad> z(K + 1);  // 2^64 P_m = 2^64 Phi(-(m + 1/2) / s)
  for (std::int64_t m = 0; m <= K; ++m) z[m] = two64 * tail(m);
  // D = T_k - y_k for k = -K-1 .. K (T_-K-1 = 0, T_K = 2^64): each T_k is floor(y_k) exactly when D is in
  // (-1 - e, e], i.e. floor(y~ - e) <= T_k <= floor(y~ + e) of the computed y~; the total variation
  // 1/2 (sum of |q - p| + P(|Z| > K)) is 2^-65 (sum of |D_k - D_k-1| + 2 z_K), within (K + 1) e 2^-64.
  const std::vector<std::int64_t>& t = table.thresholds;
  Quad previous = -z[K], gap = 0;
  for (std::size_t i = 0; i <= t.size(); ++i) {
    const std::int64_t k = static_cast<std::int64_t>(i) - K;
    Quad d = z[K];
    if (i < t.size()) {
      const Quad threshold = static_cast<std::uint64_t>(t[i]) ^ std::uint64_t{1} << 63;  // T_k
      d = k < 0 ? threshold - z[-k - 1] : (threshold - two64) + z[k];
      if (!(d > -1 - kThresholdError && d <= kThresholdError)) {
        return "its threshold T_" + std::to_string(k) + " is not floor(2^64 Phi((k + 1/2) / (L * sigma)))" + of;
      }
    }
    gap += d > previous ? d - previous : previous - d;
    previous = d;
  }
  const Quad tv = (gap + 2 * z[K]) / 2 / two64, margin = (K + 1) * kThresholdError / two64;
  const Quad stated = table.tv_per_element;
  if (!(stated >= tv - margin && stated <= tv * (1 + kTvSlack) + margin)) {
    return "its total variation " + format_repr(table.tv_per_element) + " is not that of its thresholds" + of;
  }
  double bound = static_cast<double>(tv + margin);
  if (bound < tv + margin) bound = std::nextafter(bound, INFINITY);
  table.tv_per_element = std::max(table.tv_per_element, bound);
  return "";
}

}  // namespace

SoundTable read_sound_table(const std::string& path) {
  const NpyArray array = read_npy(path);
  const auto refuse = [&](const std::string& problem) { return UserError(path + ": " + problem); };
  const std::string again = "; write it again with dmae-sound-table";
  if (array.dtype != "<i8" || array.shape.size() != 1 || array.i64.empty() ||
      (array.i64[0] != kSoundTableTag && array.i64[0] != kOldSoundTableTag)) {
    throw refuse("not a sound-noise table (write one with dmae-sound-table)");
  }
  const std::vector<std::int64_t>& words = array.i64;
  if (words[0] == kOldSoundTableTag) {
    throw refuse("a sound table in the first format (dmaesnd1, without a digest)" + again);
  }
  if (words.size() < kSoundTableHeader ||
      !std::equal(words.begin() + 5, words.begin() + kSoundTableHeader, digest_words(words).begin())) {
    throw refuse("its SHA-256 digest does not match its contents (a damaged or altered file)" + again);
  }
  SoundTable table{words[1], words[2], from_bits(words[3]), from_bits(words[4]), {}};
  if (table.grid < 1 || table.K < 1 || table.grid >= kMaxSum || table.K >= kMaxSum - table.grid) {
    throw refuse("grid " + std::to_string(table.grid) + " or K " + std::to_string(table.K) + " out of range");
  }
  if (!(std::isfinite(table.sigma) && table.sigma > 0 && std::isfinite(table.tv_per_element) &&
        table.tv_per_element > 0 && table.tv_per_element < 1)) {
    throw refuse("its sigma or total variation is not a valid number (sigma positive and finite, "
                 "the total variation in (0, 1))");
  }
  const long double steps = static_cast<long double>(table.grid) * table.sigma;
  if (!(steps >= kMinSteps && steps <= kSoundMaxSteps)) {
    throw refuse("sigma " + format_repr(table.sigma) + " on the 1/" + std::to_string(table.grid) +
                 " grid is outside the tables dmae-sound-table writes (grid * sigma in [1e-06, 4096])");
  }
  const auto count = static_cast<std::size_t>(2 * table.K);
  if (words.size() - kSoundTableHeader != count) {
    throw refuse("holds " + std::to_string(words.size() - kSoundTableHeader) + " thresholds, K = " +
                 std::to_string(table.K) + " needs " + std::to_string(count) + " (a truncated or altered file)");
  }
  table.thresholds.assign(words.begin() + kSoundTableHeader, words.end());
  const std::vector<std::int64_t>& s = table.thresholds;
  if (!std::is_sorted(s.begin(), s.end())) throw refuse("its thresholds are not in ascending order");
  for (std::size_t i = 0; i < count / 2; ++i) {  // T_k + T_-k-1 = 2^64 - 1 or 2^64: Phi(x) + Phi(-x) = 1
    const __int128 sum = static_cast<__int128>(s[i]) + s[count - 1 - i];
    if (sum != 0 && sum != -1) throw refuse("its thresholds are not symmetric about 0 (an altered file)");
  }
  const std::string problem = semantic_problem(table);
  if (!problem.empty()) throw refuse(problem + " (an altered file)" + again);
  return table;
}

void rounded_gaussian_noise(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                            std::size_t numel, const SoundTable& table, std::int32_t* out) {
  const std::vector<std::int64_t>& s = table.thresholds;
  const auto draw = [&](std::uint32_t hi, std::uint32_t lo) {
    const std::uint64_t u = std::uint64_t{hi} << 32 | lo;
    const auto v = static_cast<std::int64_t>(u ^ std::uint64_t{1} << 63);  // U - 2^63, as int64
    return static_cast<std::int32_t>(std::upper_bound(s.begin(), s.end(), v) - s.begin() - table.K);
  };
  for (std::size_t pair = 0; pair < (numel + 1) / 2; ++pair) {
    const Words w = philox4x32(
        {static_cast<std::uint32_t>(pair), sample, image, static_cast<std::uint32_t>(phase)}, seed);
    out[2 * pair] = draw(w[0], w[1]);
    if (2 * pair + 1 < numel) out[2 * pair + 1] = draw(w[2], w[3]);
  }
}

std::vector<std::int32_t> grid_integers(const float* image, std::size_t numel, std::int64_t grid,
                                        const std::string& what) {
  std::vector<std::int32_t> integers(numel);
  for (std::size_t e = 0; e < numel; ++e) {
    // on the grid: k / L as float32 stores it (as dmae_fast/data/grid.py), nothing a fraction of a step off
    const double x = std::round(static_cast<double>(image[e]) * static_cast<double>(grid));
    const bool stored = image[e] == static_cast<float>(x) / static_cast<float>(grid);
    if (!(stored && x >= 0 && x <= static_cast<double>(grid))) {
      char value[32];
      std::snprintf(value, sizeof value, "%.9g", static_cast<double>(image[e]));
      throw UserError(what + " is not on the 1/" + std::to_string(grid) + " grid (element " + std::to_string(e) +
                      " = " + value + "): --sound needs images whose pixel values are k/" + std::to_string(grid));
    }
    integers[e] = static_cast<std::int32_t>(x);
  }
  return integers;
}

void sound_input(const std::int32_t* grid_image, const std::int32_t* noise, std::size_t numel,
                 std::int64_t grid, float* out) {
  const auto divisor = static_cast<float>(grid);
  for (std::size_t e = 0; e < numel; ++e) out[e] = static_cast<float>(grid_image[e] + noise[e]) / divisor;
}

}  // namespace dmae_smooth
