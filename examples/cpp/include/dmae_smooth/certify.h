// CERTIFY and PREDICT with exactly Cohen, Rosenfeld & Kolter's (2019) semantics, as in
// dmae_fast/batching/core.py: decisions are pure functions of class counts, and the
// counts come from a Sampler (noise + classifier + counting, on the host or a device).
#pragma once

#include <cstdint>
#include <vector>

#include "dmae_smooth/noise.h"

namespace dmae_smooth {

constexpr std::int64_t kAbstain = -1;

struct Certificate {
  std::int64_t prediction;  // kAbstain or the certified class
  double radius;            // 0 when abstaining
  std::int64_t n0, n, n_a;  // selection samples, estimation samples, estimation votes for it
  double p_a_lower;
};

struct Prediction {
  std::int64_t prediction;  // kAbstain or the predicted class
  std::int64_t n, count1, count2;
  double pvalue;
};

// The noisy samples every image gets: sizes[i] samples (0 .. sizes[i]-1) of phases[i].
struct SamplingPlan {
  std::vector<Phase> phases;
  std::vector<std::uint32_t> sizes;

  static SamplingPlan certify(std::uint32_t n0, std::uint32_t n) {
    return {{Phase::Selection, Phase::Estimation}, {n0, n}};
  }
  static SamplingPlan predict(std::uint32_t n) { return {{Phase::Prediction}, {n}}; }
  std::uint64_t total() const;
};

// One batch of a plan's rows: row r is sample `sample[r]` of stage `stage[r]`.
struct PlanBatch {
  std::vector<std::uint32_t> stage;
  std::vector<std::uint32_t> sample;
  std::size_t size() const { return stage.size(); }
};

// The plan's rows in order (stage by stage), cut into batches of at most `batch` rows; a
// batch may span stages, as in the Python streaming certifier.
std::vector<PlanBatch> plan_batches(const SamplingPlan& plan, std::uint32_t batch);

struct SoundTable;

// The noise added to an image: level sigma (in [0, 1] pixel units) and seed; with `sound`, the
// exact rounded Gaussian on the table's grid (sound_noise.h), else the Gaussian of noise.h.
struct NoiseSpec {
  double sigma;
  std::uint64_t seed;
  const SoundTable* sound = nullptr;  // not owned
};

// Noise + classifier + counting: the class counts of one image's noisy samples.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::int64_t num_classes() const = 0;
  // counts[s * num_classes() + c]: samples of plan stage s classified as c, each sample
  // being image + sigma * noise(seed, index, phase, sample) with float32 arithmetic (with
  // noise.sound: float32(X + Z) / float32(L), X = round(image * L));
  // `image` is float32 [C, H, W] (the engine's input shape) in [0, 1].
  virtual std::vector<std::int64_t> counts(const float* image, std::uint32_t index,
                                           const SamplingPlan& plan, const NoiseSpec& noise) = 0;
};

// CERTIFY's decision from the counts of its selection and estimation draws.
Certificate certify_from_counts(const std::int64_t* selection, const std::int64_t* estimation,
                                std::int64_t num_classes, double alpha, double sigma);

// PREDICT's decision from the counts of its draw.
Prediction predict_from_counts(const std::int64_t* counts, std::int64_t num_classes, double alpha);

// The smoothed classifier around a Sampler, one image at a time.
class Smoother {
 public:
  Smoother(Sampler& sampler, NoiseSpec noise) : sampler_(sampler), noise_(noise) {}
  Certificate certify(const float* image, std::uint32_t index, std::uint32_t n0, std::uint32_t n,
                      double alpha);
  Prediction predict(const float* image, std::uint32_t index, std::uint32_t n, double alpha);

 private:
  Sampler& sampler_;
  NoiseSpec noise_;
};

}  // namespace dmae_smooth
