// dmae-smooth-check: the library's functions on queries from stdin, one result line per
// query line, for tests that compare them with SciPy, dmae_fast.noise and dmae_fast.run.results.
//
//   ppf P                 -> Phi^-1(P)                         (%.17g)
//   betainc A B X         -> I_X(A, B)
//   bound NA N ALPHA      -> Clopper-Pearson lower bound
//   binom K N             -> two-sided binomial test p-value at 1/2
//   words SEED IMAGE PHASE SAMPLE NUMEL -> the uint32 stream (space-separated)
//   gauss SEED IMAGE PHASE SAMPLE NUMEL -> std:: Gaussians as float32 bit patterns
//   gauss-torch SEED IMAGE PHASE SAMPLE NUMEL -> ATen Gaussians (CPU) as bit patterns
//   sha256 HEX            -> the SHA-256 digest (hex) of the bytes HEX spells ("-" for none)
//   table PATH            -> a sound table's grid, K, sigma, tv per element (%.17g), or "error: ..."
//   sound PATH SEED IMAGE PHASE SAMPLE NUMEL -> the sound noise integers Z with that table
//   sound-input PATH SEED IMAGE PHASE SAMPLE NUMEL -> float32(X + Z) / L as bit patterns, for the
//                         image X_e = e mod (L + 1) given as float32 X_e / L
//   floor VALUE DECIMALS / ceil VALUE DIGITS / repr VALUE / duration SECONDS -> the results-file formats
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dmae_smooth/error.h"
#include "dmae_smooth/noise.h"
#include "dmae_smooth/results.h"
#include "dmae_smooth/sha256.h"
#include "dmae_smooth/sound_noise.h"
#include "dmae_smooth/stats.h"
#ifdef DMAE_SMOOTH_WITH_TORCH
#include <ATen/ops/empty.h>

#include "dmae_smooth/aoti.h"
#endif

namespace {

using namespace dmae_smooth;

std::string number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

template <typename T>
std::string join(const std::vector<T>& values) {
  std::ostringstream out;
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? " " : "") << values[i];
  return out.str();
}

std::string bits(const std::vector<float>& values) {
  std::vector<std::uint32_t> patterns(values.size());
  std::memcpy(patterns.data(), values.data(), values.size() * sizeof(float));
  return join(patterns);
}

// The sound table of a file, read once.
const SoundTable& sound_table(const std::string& path) {
  static std::map<std::string, SoundTable> tables;
  auto at = tables.find(path);
  if (at == tables.end()) at = tables.emplace(path, read_sound_table(path)).first;
  return at->second;
}

std::string answer(const std::string& line) {
  std::istringstream in(line);
  std::string op;
  in >> op;
  if (op == "ppf") {
    double p;
    in >> p;
    return number(normal_ppf(p));
  }
  if (op == "betainc") {
    double a, b, x;
    in >> a >> b >> x;
    return number(incomplete_beta(a, b, x));
  }
  if (op == "bound") {
    std::int64_t n_a, n;
    double alpha;
    in >> n_a >> n >> alpha;
    return number(clopper_pearson_lower(n_a, n, alpha));
  }
  if (op == "binom") {
    std::int64_t k, n;
    in >> k >> n;
    return number(binomial_test_pvalue(k, n));
  }
  if (op == "floor" || op == "ceil") {
    double value;
    int digits;
    in >> value >> digits;
    return op == "floor" ? format_floor(value, digits) : format_ceil_significant(value, digits);
  }
  if (op == "repr") {
    double value;
    in >> value;
    return format_repr(value);
  }
  if (op == "duration") {
    double seconds;
    in >> seconds;
    return format_duration(seconds);
  }
  if (op == "sha256") {
    std::string hex, bytes;
    in >> hex;
    for (std::size_t i = 0; hex != "-" && i + 1 < hex.size(); i += 2) {
      bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    }
    std::string out;
    char digit[3];
    for (const std::uint8_t byte : sha256(bytes.data(), bytes.size())) {
      std::snprintf(digit, sizeof digit, "%02x", byte);
      out += digit;
    }
    return out;
  }
  std::string path;
  if (op == "table" || op == "sound" || op == "sound-input") in >> path;
  if (op == "table") {
    const SoundTable& table = sound_table(path);
    return std::to_string(table.grid) + " " + std::to_string(table.K) + " " + number(table.sigma) + " " +
           number(table.tv_per_element);
  }
  std::uint64_t seed;
  std::uint32_t image, phase, sample;
  std::size_t numel;
  in >> seed >> image >> phase >> sample >> numel;
  if (op == "sound" || op == "sound-input") {
    const SoundTable& table = sound_table(path);
    std::vector<std::int32_t> noise(numel);
    rounded_gaussian_noise(seed, image, static_cast<Phase>(phase), sample, numel, table, noise.data());
    if (op == "sound") return join(noise);
    std::vector<float> clean(numel), inputs(numel);
    for (std::size_t e = 0; e < numel; ++e) {
      clean[e] = static_cast<float>(e % static_cast<std::size_t>(table.grid + 1)) / static_cast<float>(table.grid);
    }
    const std::vector<std::int32_t> grid_image = grid_integers(clean.data(), numel, table.grid, "the test image");
    sound_input(grid_image.data(), noise.data(), numel, table.grid, inputs.data());
    return bits(inputs);
  }
  if (op == "words") {
    std::vector<std::uint32_t> words(4 * ((numel + 3) / 4));
    uint32_stream(seed, image, static_cast<Phase>(phase), sample, numel, words.data());
    return join(words);
  }
  if (op == "gauss") {
    std::vector<float> values(numel);
    gaussian_noise(seed, image, static_cast<Phase>(phase), sample, numel, values.data());
    return bits(values);
  }
#ifdef DMAE_SMOOTH_WITH_TORCH
  if (op == "gauss-torch") {
    const auto padded = static_cast<std::int64_t>(4 * ((numel + 3) / 4));
    at::Tensor uniforms = at::empty({1, padded}, at::kFloat);
    uniform_stream(seed, image, static_cast<Phase>(phase), sample, numel, uniforms.data_ptr<float>());
    const at::Tensor g = uniform_to_gaussian(uniforms).narrow(1, 0, static_cast<std::int64_t>(numel)).contiguous();
    return bits(std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + numel));
  }
#endif
  return "error: unknown query '" + op + "'";
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    try {
      std::cout << answer(line) << "\n";
    } catch (const UserError& error) {
      std::cout << "error: " << error.what() << "\n";
    }
  }
  return 0;
}
