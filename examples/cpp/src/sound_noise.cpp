#include "dmae_smooth/sound_noise.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "dmae_smooth/error.h"
#include "dmae_smooth/npy.h"

namespace dmae_smooth {
namespace {

constexpr std::int64_t kMaxSum = std::int64_t{1} << 24;  // X + Z stays exact in float32 below this
constexpr double kGridTolerance = 1e-3;                  // as dmae_fast/data/grid.py

double from_bits(std::int64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

}  // namespace

SoundTable read_sound_table(const std::string& path) {
  const NpyArray array = read_npy(path);
  const auto refuse = [&](const std::string& problem) { return UserError(path + ": " + problem); };
  if (array.dtype != "<i8" || array.shape.size() != 1 || array.i64.size() < kSoundTableHeader ||
      array.i64[0] != kSoundTableTag) {
    throw refuse("not a sound-noise table (write one with dmae-sound-table)");
  }
  const std::vector<std::int64_t>& words = array.i64;
  SoundTable table{words[1], words[2], from_bits(words[3]), from_bits(words[4]), {}};
  if (table.grid < 1 || table.K < 1 || table.grid >= kMaxSum || table.K >= kMaxSum - table.grid) {
    throw refuse("grid " + std::to_string(table.grid) + " or K " + std::to_string(table.K) + " out of range");
  }
  if (!(std::isfinite(table.sigma) && table.sigma > 0 && std::isfinite(table.tv_per_element) &&
        table.tv_per_element >= 0 && table.tv_per_element < 1)) {
    throw refuse("its sigma or total variation is not a valid number");
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
    const double scaled = static_cast<double>(image[e]) * static_cast<double>(grid);
    const double x = std::round(scaled);
    if (!(std::abs(scaled - x) <= kGridTolerance && x >= 0 && x <= static_cast<double>(grid))) {
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
