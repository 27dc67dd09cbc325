#include <vector>

#include "dmae_smooth/engine.h"
#include "dmae_smooth/error.h"
#include "dmae_smooth/sound_noise.h"

namespace dmae_smooth {

HostSampler::HostSampler(Engine& engine, std::uint32_t batch) : engine_(engine), batch_(batch) {
  if (batch < 1) throw UserError("batch must be at least 1");
}

std::vector<std::int64_t> HostSampler::counts(const float* image, std::uint32_t index,
                                              const SamplingPlan& plan, const NoiseSpec& noise) {
  const EngineInfo& info = engine_.info();
  const auto numel = static_cast<std::size_t>(info.numel());
  const auto sigma = static_cast<float>(noise.sigma);  // torch multiplies in float32 too
  std::vector<std::int64_t> counts(plan.sizes.size() * info.num_classes, 0);
  std::vector<float> inputs, gaussians(numel);
  std::vector<std::int32_t> integers(numel);
  const std::vector<std::int32_t> grid_image =
      noise.sound ? grid_integers(image, numel, noise.sound->grid, "image " + std::to_string(index))
                  : std::vector<std::int32_t>{};
  std::vector<std::int64_t> classes;
  for (const PlanBatch& batch : plan_batches(plan, batch_)) {
    inputs.resize(batch.size() * numel);
    classes.resize(batch.size());
    for (std::size_t row = 0; row < batch.size(); ++row) {
      const Phase phase = plan.phases[batch.stage[row]];
      float* input = inputs.data() + row * numel;
      if (noise.sound) {
        rounded_gaussian_noise(noise.seed, index, phase, batch.sample[row], numel, *noise.sound, integers.data());
        sound_input(grid_image.data(), integers.data(), numel, noise.sound->grid, input);
      } else {
        gaussian_noise(noise.seed, index, phase, batch.sample[row], numel, gaussians.data());
        for (std::size_t e = 0; e < numel; ++e) input[e] = image[e] + sigma * gaussians[e];
      }
    }
    engine_.classify(inputs.data(), static_cast<std::int64_t>(batch.size()), classes.data());
    for (std::size_t row = 0; row < batch.size(); ++row) {
      if (classes[row] < 0 || classes[row] >= info.num_classes) {
        throw std::runtime_error("engine returned class " + std::to_string(classes[row]) +
                                 " outside [0, " + std::to_string(info.num_classes) + ")");
      }
      ++counts[batch.stage[row] * info.num_classes + classes[row]];
    }
  }
  return counts;
}

}  // namespace dmae_smooth
