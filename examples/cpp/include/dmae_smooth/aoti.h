// The libtorch backend: AOTInductor packages (.pt2) and a Sampler whose noise and counts
// stay on the engine's device. Compiled when CMake finds Torch (DMAE_SMOOTH_WITH_TORCH).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "dmae_smooth/engine.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace dmae_smooth {

// A torch.export + AOTInductor package ("model" inside), run on the device it was compiled
// for (its AOTI_DEVICE_KEY metadata: cpu or cuda).
class AotiEngine : public Engine {
 public:
  explicit AotiEngine(EngineInfo info);
  ~AotiEngine() override;
  const EngineInfo& info() const override { return info_; }
  std::string description() const override;
  void classify(const float* images, std::int64_t batch, std::int64_t* classes) override;

  const c10::Device& device() const { return device_; }
  // float32 logits [B, num_classes] of float32 images [B, C, H, W] on device().
  at::Tensor logits(const at::Tensor& images);

 private:
  EngineInfo info_;
  c10::Device device_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
};

// Box-Muller with ATen ops exactly as dmae_fast.noise.gaussian_rows: on the same
// device, bit for bit the Gaussians of the Python reference.
at::Tensor uniform_to_gaussian(const at::Tensor& uniforms);

// Noise from the contract (Philox words on the host, Box-Muller on the device with ATen),
// noisy images formed and classified on the device, counts kept on the device and read
// once per image. Sound noise (NoiseSpec::sound) is HostSampler's: integers and inputs on the host.
class TorchSampler : public Sampler {
 public:
  TorchSampler(AotiEngine& engine, std::uint32_t batch);
  std::int64_t num_classes() const override { return engine_.info().num_classes; }
  std::vector<std::int64_t> counts(const float* image, std::uint32_t index,
                                   const SamplingPlan& plan, const NoiseSpec& noise) override;

 private:
  AotiEngine& engine_;
  std::uint32_t batch_;
};

}  // namespace dmae_smooth
