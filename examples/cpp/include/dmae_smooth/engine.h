// Engines: an exported base classifier (a batch of images -> class indices), described by
// the JSON sidecar `<engine file>.json` that dmae-export writes beside it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dmae_smooth/certify.h"

namespace dmae_smooth {

// The sidecar fields the C++ side needs (format "dmae-fast-engine/1").
struct EngineInfo {
  std::string path;        // the engine file
  std::string kind;        // "aoti", "tensorrt" or "onnx"
  std::string input;       // "image" (the CLI runs image engines) or "tokens"
  std::string input_name;  // "images" or "tokens"
  std::string output_name;  // "logits"
  std::string precision;    // "fp32", "fp16" or "bf16"
  std::vector<std::int64_t> input_shape;  // [C, H, W] for image engines
  std::int64_t num_classes = 0;
  std::optional<double> sigma;  // the sigma the classifier was fine-tuned for, if recorded
  std::int64_t batch_max = 0;   // the largest batch the engine accepts
  std::int64_t numel() const;   // elements of one input
};

// Reads and checks `<engine_path>.json`; throws UserError naming the problem.
EngineInfo read_engine_info(const std::string& engine_path);

// A base classifier on the host's side of the fence: float32 images in [0, 1] -> classes.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual const EngineInfo& info() const = 0;
  virtual std::string description() const = 0;
  // images: host float32 [batch, *info().input_shape], C order; writes `batch` classes.
  virtual void classify(const float* images, std::int64_t batch, std::int64_t* classes) = 0;
};

// Opens an image engine file by its sidecar's kind, with the backends compiled into this
// build (AOTInductor with libtorch, TensorRT where its headers were found).
std::unique_ptr<Engine> open_engine(const std::string& engine_path);

// The portable Sampler: noise from noise.h (std:: math) or sound_noise.h on the host, any
// Engine, counts on the host.
class HostSampler : public Sampler {
 public:
  HostSampler(Engine& engine, std::uint32_t batch);
  std::int64_t num_classes() const override { return engine_.info().num_classes; }
  std::vector<std::int64_t> counts(const float* image, std::uint32_t index,
                                   const SamplingPlan& plan, const NoiseSpec& noise) override;

 private:
  Engine& engine_;
  std::uint32_t batch_;
};

// The Sampler for `engine`: a TorchSampler for AOTInductor packages (noise bit for bit as
// the Python reference, counts on the device), else a HostSampler; `host` forces the latter.
std::unique_ptr<Sampler> make_sampler(Engine& engine, std::uint32_t batch, bool host = false);

}  // namespace dmae_smooth
