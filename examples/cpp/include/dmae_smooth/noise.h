// The noise contract of dmae_fast/noise.py, in C++.
//
// Every noise value is a pure function of (seed, image index, phase, sample index,
// element index): Philox4x32-10 with key (seed lo 32 bits, seed hi 32 bits) and counter
// (element / 4, sample, image, phase); its four output words feed elements 4k .. 4k+3.
// Uniform u = ((w >> 9) + 0.5) * 2^-23 (exact in float32); Box-Muller in float32:
// elements 4k, 4k+1 from (u0, u1), elements 4k+2, 4k+3 from (u2, u3).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace dmae_smooth {

// The fourth counter word: which independent draw a sample belongs to.
enum class Phase : std::uint32_t { Selection = 0, Estimation = 1, Prediction = 2 };

using Words = std::array<std::uint32_t, 4>;

// Philox4x32-10 of one counter under a 64-bit seed.
Words philox4x32(Words counter, std::uint64_t seed);

// The raw words of one noise draw: 4 * ceil(numel / 4) values written to `out`.
void uint32_stream(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                   std::size_t numel, std::uint32_t* out);

// ((w >> 9) + 0.5) * 2^-23, exactly as dmae_fast.noise.words_to_uniform.
inline float word_to_uniform(std::uint32_t w) {
  return (static_cast<float>(w >> 9) + 0.5f) * 0x1p-23f;
}

// The uniforms of one draw: 4 * ceil(numel / 4) values written to `out`.
void uniform_stream(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                    std::size_t numel, float* out);

// Standard Gaussians of one draw (numel values), Box-Muller with std::log/sqrt/cos/sin.
// These agree with torch's vectorized transcendental functions to about one ulp, not
// always bit for bit; the libtorch backend (torch_noise.h) reproduces torch exactly.
void gaussian_noise(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                    std::size_t numel, float* out);

}  // namespace dmae_smooth
