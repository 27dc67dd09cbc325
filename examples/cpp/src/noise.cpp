#include "dmae_smooth/noise.h"

#include <cmath>
#include <vector>

namespace dmae_smooth {
namespace {

constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // Philox4x32 multipliers
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key increments
constexpr int kRounds = 10;
constexpr float kTwoPi = static_cast<float>(2.0 * 3.14159265358979323846);  // as torch rounds it

}  // namespace

Words philox4x32(Words c, std::uint64_t seed) {
  auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    const std::uint64_t p0 = std::uint64_t{kMul0} * c[0], p1 = std::uint64_t{kMul1} * c[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

void uint32_stream(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                   std::size_t numel, std::uint32_t* out) {
  const std::size_t blocks = (numel + 3) / 4;
  for (std::size_t block = 0; block < blocks; ++block) {
    const Words w = philox4x32(
        {static_cast<std::uint32_t>(block), sample, image, static_cast<std::uint32_t>(phase)}, seed);
    for (int j = 0; j < 4; ++j) out[4 * block + j] = w[j];
  }
}

void uniform_stream(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                    std::size_t numel, float* out) {
  const std::size_t blocks = (numel + 3) / 4;
  for (std::size_t block = 0; block < blocks; ++block) {
    const Words w = philox4x32(
        {static_cast<std::uint32_t>(block), sample, image, static_cast<std::uint32_t>(phase)}, seed);
    for (int j = 0; j < 4; ++j) out[4 * block + j] = word_to_uniform(w[j]);
  }
}

void gaussian_noise(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                    std::size_t numel, float* out) {
  std::vector<float> u(4 * ((numel + 3) / 4));
  uniform_stream(seed, image, phase, sample, numel, u.data());
  for (std::size_t i = 0; i < numel; i += 2) {
    const float radius = std::sqrt(-2.0f * std::log(u[i]));
    const float angle = kTwoPi * u[i + 1];
    out[i] = radius * std::cos(angle);
    if (i + 1 < numel) out[i + 1] = radius * std::sin(angle);
  }
}

}  // namespace dmae_smooth
