// The sound noise of `--sound` (issue 37; dmae_fast/sound_noise.py), in C++, bit for bit.
//
// Inputs on a grid: x = X / L with X integer in [0, L]. Noise: Z = round(L * eps),
// eps ~ N(0, sigma^2), drawn exactly from fair Philox bits by integer thresholds:
// element e of the flat [C, H, W] image uses the counter (e / 2, sample, image, phase);
// element 2j takes the words (w0, w1), element 2j + 1 the words (w2, w3), as
// U = w_hi * 2^32 + w_lo, V = int64(U ^ 2^63), and Z = -K + #{k : S_k <= V}.
// The classifier sees float32(X + Z) / float32(L), a function of the exact integer sum alone.
//
// The thresholds S_k (exact, from mpmath) come in a file `dmae-sound-table` writes: a 1-D
// int64 .npy array [tag, L, K, sigma's float64 bits, tv's float64 bits, D0 .. D3, S_-K .. S_K-1],
// D0 .. D3 the SHA-256 digest (32 bytes as four little-endian int64) of every other word's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dmae_smooth/noise.h"

namespace dmae_smooth {

// The first word of a sound-table file: "dmaesnd2" as a little-endian int64 ("dmaesnd1": the first
// format, without a digest, refused).
inline constexpr std::int64_t kSoundTableTag = 0x32646e7365616d64;
inline constexpr std::int64_t kOldSoundTableTag = 0x31646e7365616d64;
inline constexpr std::size_t kSoundTableHeader = 9;  // tag, L, K, sigma bits, tv bits, four digest words
inline constexpr double kSoundMaxSteps = 4096;       // the largest L * sigma (dmae_fast's table_problem)

struct SoundTable {
  std::int64_t grid = 0;        // L: inputs are X / L, X in [0, L]
  std::int64_t K = 0;           // |Z| <= K
  double sigma = 0;             // noise level in [0, 1] pixel units
  double tv_per_element = 0;    // total variation to the exact rounded Gaussian, per element (an upper bound)
  std::vector<std::int64_t> thresholds;  // S_-K .. S_K-1: 2K shifted thresholds, ascending
};

// Reads and checks a table written by dmae-sound-table; throws UserError naming the file and
// the problem: not a table (or the first format), a digest that does not match, L * sigma beyond
// kSoundMaxSteps, truncated, thresholds out of order or not symmetric, a K that is not the truncation
// of the header's sigma and grid, a T_k that is not floor(2^64 Phi((k + 1/2) / (L * sigma))) (checked
// exactly, in 113-bit floating point), or a total variation that is not its thresholds'. The table's
// tv_per_element is the larger of the file's and the one recomputed from the thresholds: a true bound.
SoundTable read_sound_table(const std::string& path);

// The integer noise Z of one draw: numel values written to `out`.
void rounded_gaussian_noise(std::uint64_t seed, std::uint32_t image, Phase phase, std::uint32_t sample,
                            std::size_t numel, const SoundTable& table, std::int32_t* out);

// X = round(c * L) of a float32 image c in [0, 1]; throws UserError, naming `what` and the first
// element off the grid (|c * L - X| > 1e-3 or X outside [0, L]), as dmae_fast/data/grid.py.
std::vector<std::int32_t> grid_integers(const float* image, std::size_t numel, std::int64_t grid,
                                        const std::string& what);

// The classifier's input: float32(X + Z) / float32(L), numel values written to `out`.
void sound_input(const std::int32_t* grid_image, const std::int32_t* noise, std::size_t numel,
                 std::int64_t grid, float* out);

}  // namespace dmae_smooth
