// dmae-smooth: certify (CERTIFY) or predict (PREDICT) a .npy image set with an engine file.
//
//   dmae-smooth certify --engine model.pt2 --images images.npy --labels labels.npy --out r.tsv
//
// Results rows are those of dmae-certify, so its analysis reads them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dmae_smooth/certify.h"
#include "dmae_smooth/engine.h"
#include "dmae_smooth/error.h"
#include "dmae_smooth/npy.h"
#include "dmae_smooth/results.h"
#include "dmae_smooth/sound_noise.h"

namespace {

using dmae_smooth::UserError;

constexpr const char* kProg = "dmae-smooth";
constexpr const char* kUsage =
    "usage: dmae-smooth {certify,predict} --engine FILE --images IMAGES.npy --labels LABELS.npy\n"
    "                   [--sigma S] [--n0 100] [--n 10000] [--alpha 0.001] [--seed N]\n"
    "                   [--batch 1000] [--skip 1] [--max M] [--out FILE] [--overwrite]\n"
    "                   [--host-noise] [--sound TABLE.npy] [--quiet]\n"
    "\n"
    "Certify (Cohen et al.'s CERTIFY) or predict (PREDICT) every --skip-th image of a .npy\n"
    "float32 [N, C, H, W] array in [0, 1] with the Gaussian-smoothed classifier of an engine\n"
    "file (.pt2 AOTInductor package or TensorRT .engine, with its <engine>.json sidecar).\n"
    "Noise follows dmae_fast's contract: results equal dmae-certify's for the same seed.\n"
    "\n"
    "  --engine FILE      engine file; its sidecar FILE.json gives shape, classes, sigma\n"
    "  --images FILE      .npy float32 [N, C, H, W], pixel values in [0, 1]\n"
    "  --labels FILE      .npy int64 [N], the true classes\n"
    "  --sigma S          noise level in [0, 1] pixel units (default: the sidecar's sigma)\n"
    "  --n0 N0            CERTIFY's selection samples (default 100)\n"
    "  --n N              estimation samples (PREDICT: samples) (default 10000)\n"
    "  --alpha A          failure probability (default 0.001)\n"
    "  --seed SEED        64-bit noise seed: reproduces a run (default: a fresh seed from the OS, printed)\n"
    "  --batch B          noisy samples per forward pass (default min(1000, engine max))\n"
    "  --skip K           every K-th image from index 0 (default 1)\n"
    "  --max M            at most M images\n"
    "  --out FILE         results file (default: <command>-<images>-<time>.tsv)\n"
    "  --overwrite        replace an existing --out (atomically, when the run completes)\n"
    "  --host-noise       noise with std:: math on the host even for .pt2 engines\n"
    "  --sound TABLE      sound noise: images on the table's grid (k/L), the exact rounded Gaussian\n"
    "                     from the table dmae-sound-table wrote (its sigma is the default --sigma)\n"
    "  --quiet            no progress line\n";

struct Options {
  bool predict = false;
  std::string engine, images, labels, out, sound;
  std::optional<double> sigma;
  std::uint32_t n0 = 100, n = 10000;
  double alpha = 0.001;
  std::optional<std::uint64_t> seed;  // none: a fresh one from the operating system
  std::optional<std::uint32_t> batch;
  std::uint64_t skip = 1;
  std::optional<std::uint64_t> max_images;
  bool overwrite = false, host_noise = false, quiet = false;
};

std::uint64_t parse_unsigned(const std::string& flag, const std::string& text, std::uint64_t low,
                             std::uint64_t high) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    if (text.empty() || text[0] == '-' || text[0] == '+') throw std::invalid_argument(text);
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty()) throw UserError(flag + " needs an integer, got '" + text + "'");
  if (value < low || value > high) {
    throw UserError(flag + " must be in [" + std::to_string(low) + ", " + std::to_string(high) + "], got " + text);
  }
  return value;
}

double parse_double(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !std::isfinite(value)) {
    throw UserError(flag + " needs a finite number, got '" + text + "'");
  }
  return value;
}

Options parse_options(int argc, char** argv) {
  if (argc < 2) throw UserError("a command is required: certify or predict (see --help)");
  const std::string command = argv[1];
  if (command != "certify" && command != "predict") {
    throw UserError("unknown command '" + command + "' (certify or predict)");
  }
  Options o;
  o.predict = command == "predict";
  const std::map<std::string, bool*> switches{
      {"--overwrite", &o.overwrite}, {"--host-noise", &o.host_noise}, {"--quiet", &o.quiet}};
  constexpr std::uint64_t kMax32 = 0xFFFFFFFFu;
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (const auto s = switches.find(flag); s != switches.end()) {
      *s->second = true;
      continue;
    }
    if (i + 1 >= argc) throw UserError(flag.rfind("--", 0) == 0 ? flag + " needs a value" : "unexpected argument '" + flag + "'");
    const std::string value = argv[++i];
    if (flag == "--engine") o.engine = value;
    else if (flag == "--images") o.images = value;
    else if (flag == "--labels") o.labels = value;
    else if (flag == "--out") o.out = value;
    else if (flag == "--sound") o.sound = value;
    else if (flag == "--sigma") o.sigma = parse_double(flag, value);
    else if (flag == "--n0") o.n0 = static_cast<std::uint32_t>(parse_unsigned(flag, value, 1, kMax32));
    else if (flag == "--n") o.n = static_cast<std::uint32_t>(parse_unsigned(flag, value, 1, kMax32));
    else if (flag == "--alpha") o.alpha = parse_double(flag, value);
    else if (flag == "--seed") o.seed = parse_unsigned(flag, value, 0, ~std::uint64_t{0});
    else if (flag == "--batch") o.batch = static_cast<std::uint32_t>(parse_unsigned(flag, value, 1, kMax32));
    else if (flag == "--skip") o.skip = parse_unsigned(flag, value, 1, ~std::uint64_t{0});
    else if (flag == "--max") o.max_images = parse_unsigned(flag, value, 1, ~std::uint64_t{0});
    else throw UserError("unknown option '" + flag + "' (see --help)");
  }
  for (const auto& [flag, value] : {std::pair{"--engine", o.engine}, {"--images", o.images}, {"--labels", o.labels}}) {
    if (value.empty()) throw UserError(std::string(flag) + " is required");
  }
  if (o.sigma && !(*o.sigma > 0)) throw UserError("--sigma must be > 0, got " + std::to_string(*o.sigma));
  if (!(o.alpha > 0 && o.alpha < 1)) throw UserError("--alpha must be in (0, 1)");
  return o;
}

std::string default_out(const Options& o) {
  std::string stem = o.images.substr(o.images.find_last_of('/') + 1);
  stem = stem.substr(0, stem.rfind('.'));
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return std::string(o.predict ? "predict-" : "certify-") + stem + "-" + stamp + ".tsv";
}

// The images and labels to certify, checked against the engine: shapes, dtypes, values.
struct Inputs {
  dmae_smooth::NpyArray images, labels;
  std::vector<std::int64_t> indices;  // dataset indices: every --skip-th, at most --max
};

// With a sound table, every image must be on its grid: refused before any row is written.
Inputs load_inputs(const Options& options, const dmae_smooth::EngineInfo& info, const dmae_smooth::SoundTable* sound) {
  Inputs in{dmae_smooth::read_npy(options.images), dmae_smooth::read_npy(options.labels), {}};
  std::vector<std::int64_t> expected{-1};
  expected.insert(expected.end(), info.input_shape.begin(), info.input_shape.end());
  if (in.images.dtype != "<f4" || in.images.shape.size() != expected.size() ||
      !std::equal(expected.begin() + 1, expected.end(), in.images.shape.begin() + 1)) {
    std::string want = "[N";
    for (const std::int64_t d : info.input_shape) want += ", " + std::to_string(d);
    throw UserError(options.images + ": expected float32 images " + want + "] (the engine's input shape)");
  }
  const std::int64_t count = in.images.shape[0];
  if (in.labels.dtype != "<i8" || in.labels.shape != std::vector<std::int64_t>{count}) {
    throw UserError(options.labels + ": expected int64 labels [" + std::to_string(count) + "], one per image");
  }
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(count) &&
                            (!options.max_images || in.indices.size() < *options.max_images);
       i += options.skip) {
    if (i > 0xFFFFFFFFu) throw UserError("image index " + std::to_string(i) + " outside the noise contract's range [0, 2**32)");
    in.indices.push_back(static_cast<std::int64_t>(i));
  }
  const std::int64_t numel = info.numel();
  for (const std::int64_t i : in.indices) {
    const float* image = in.images.f32.data() + i * numel;
    if (!std::all_of(image, image + numel, [](float v) { return std::isfinite(v); })) {
      throw UserError("image " + std::to_string(i) + " contains NaN or infinite pixel values");
    }
    if (sound) dmae_smooth::grid_integers(image, static_cast<std::size_t>(numel), sound->grid, "image " + std::to_string(i));
    if (in.labels.i64[i] < 0 || in.labels.i64[i] >= info.num_classes) {
      throw UserError(options.labels + ": label " + std::to_string(in.labels.i64[i]) + " of image " +
                      std::to_string(i) + " is not a class of the engine (0 .. " +
                      std::to_string(info.num_classes - 1) + ")");
    }
  }
  return in;
}

std::uint64_t fresh_seed() {
  std::random_device device;  // the operating system's entropy (getrandom / /dev/urandom on Linux)
  return (static_cast<std::uint64_t>(device()) << 32) | static_cast<std::uint64_t>(device());
}

int run(const Options& options) {
  auto engine = dmae_smooth::open_engine(options.engine);
  const dmae_smooth::EngineInfo& info = engine->info();
  std::optional<dmae_smooth::SoundTable> sound;
  if (!options.sound.empty()) sound = dmae_smooth::read_sound_table(options.sound);
  if (sound && options.sigma && *options.sigma != sound->sigma) {
    throw UserError("--sigma " + dmae_smooth::format_repr(*options.sigma) + " is not the sigma of the sound table " +
                    options.sound + " (" + dmae_smooth::format_repr(sound->sigma) +
                    "): leave --sigma out or write a table for this sigma");
  }
  if (!options.sigma && !sound && !info.sigma) {
    throw UserError("--sigma is required: the engine's sidecar does not record the sigma it was trained for");
  }
  const double sigma = options.sigma ? *options.sigma : sound ? sound->sigma : *info.sigma;
  const std::uint32_t batch = options.batch.value_or(static_cast<std::uint32_t>(std::min<std::int64_t>(1000, info.batch_max)));
  if (batch > info.batch_max) {
    throw UserError("--batch " + std::to_string(batch) + " exceeds the engine's maximum batch " +
                    std::to_string(info.batch_max) + " (its sidecar)");
  }
  const Inputs inputs = load_inputs(options, info, sound ? &*sound : nullptr);
  const std::vector<std::int64_t>& indices = inputs.indices;
  const std::int64_t numel = info.numel();
  const std::string out = options.out.empty() ? default_out(options) : options.out;
  dmae_smooth::ResultsWriter writer(out, options.predict ? dmae_smooth::kPredictHeader : dmae_smooth::kCertifyHeader,
                                    options.overwrite);
  auto sampler = dmae_smooth::make_sampler(*engine, batch, options.host_noise);
  // drawn only now, with the classifier opened: a classifier made knowing the seed could forge certificates
  const std::uint64_t seed = options.seed ? *options.seed : fresh_seed();
  dmae_smooth::Smoother smoother(*sampler, {sigma, seed, sound ? &*sound : nullptr});
  const std::uint64_t per_image = options.predict ? options.n : std::uint64_t{options.n0} + options.n;
  std::string noise = options.host_noise ? ", host noise" : "";
  if (sound) {  // the thresholds' total variation, per image: added to alpha (an upper bound)
    const double tv = std::nextafter(static_cast<double>(per_image * numel) * sound->tv_per_element, INFINITY);
    noise = ", sound noise on the 1/" + std::to_string(sound->grid) + " grid (each image's failure probability: alpha + " +
            dmae_smooth::format_ceil_significant(tv, 3) + ")";
  }
  std::cerr << kProg << ": " << indices.size() << " images, " << per_image << " samples each, "
            << (options.predict ? "predict" : dmae_smooth::kFixedNProcedure) << ", sigma " << dmae_smooth::format_repr(sigma)
            << ", " << engine->description() << noise << ", seed " << seed << ", batch " << batch << " -> " << out
            << "\n";
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0, certified = 0, radius_sum = 0;
  std::size_t finished = 0;
  for (const std::int64_t i : indices) {
    const float* image = inputs.images.f32.data() + i * numel;
    const std::int64_t label = inputs.labels.i64[i];
    const auto index = static_cast<std::uint32_t>(i);
    std::string row;
    if (options.predict) {
      const dmae_smooth::Prediction p = smoother.predict(image, index, options.n, options.alpha);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      row = dmae_smooth::predict_row(i, label, p, elapsed / (finished + 1), sigma);
      certified += p.prediction == label;
    } else {
      const dmae_smooth::Certificate c = smoother.certify(image, index, options.n0, options.n, options.alpha);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      row = dmae_smooth::certify_row(i, label, c, elapsed / (finished + 1), sigma, sound.has_value());
      certified += c.prediction == label;
      radius_sum += c.prediction == label ? c.radius : 0.0;
    }
    writer.write(row);  // the time column: the image's share of the run's time, as dmae-certify
    ++finished;
    if (!options.quiet) {
      std::fprintf(stderr, "\r%s: %zu/%zu images, %.0f samples/s", kProg, finished, indices.size(),
                   elapsed > 0 ? finished * per_image / elapsed : 0.0);
    }
  }
  writer.commit();
  if (!options.quiet && finished > 0) std::fputc('\n', stderr);
  const double n = static_cast<double>(std::max<std::size_t>(finished, 1));
  std::fprintf(stderr, "%s: %zu images in %.1f s; results in %s\n", kProg, finished, elapsed, out.c_str());
  if (options.predict) {
    std::printf("accuracy of the smoothed classifier: %.1f%%\n", 100.0 * certified / n);
  } else {
    std::printf("certified accuracy at radius 0: %.1f%%; average certified radius (ACR): %.3f\n",
                100.0 * certified / n, radius_sum / n);
  }
  return 0;
}

// The first line of an exception's message (library messages can carry stack traces).
std::string first_line(const std::exception& error) {
  const std::string message = error.what();
  return message.substr(0, message.find('\n'));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  try {
    return run(parse_options(argc, argv));
  } catch (const UserError& error) {
    std::cerr << kProg << ": error: " << first_line(error) << "\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << kProg << ": error: " << first_line(error) << "\n";
    return 1;
  }
}
