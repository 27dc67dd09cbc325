#include "dmae_smooth/aoti.h"

#include <ATen/ops/cos.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/log.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#include <algorithm>

#include "dmae_smooth/error.h"

namespace dmae_smooth {
namespace {

// The first line of a c10::Error, without the C++ stack trace.
std::string first_line(const c10::Error& error) {
  const std::string message = error.msg();
  return message.substr(0, message.find('\n'));
}

// libtorch releases whose package loader is known to crash the process: on torch 2.11.0 loading a
// freshly compiled package died with a segmentation fault (bench/results/2026-12-02-aoti-torch-2.11);
// the same bound as dmae_fast.engines.aoti_engine.AOTI_MIN_TORCH.
constexpr int kMinTorchMajor = 2, kMinTorchMinor = 12;

void check_libtorch(const std::string& path) {
  if (TORCH_VERSION_MAJOR > kMinTorchMajor ||
      (TORCH_VERSION_MAJOR == kMinTorchMajor && TORCH_VERSION_MINOR >= kMinTorchMinor)) {
    return;
  }
  throw UserError("cannot load " + path + ": AOTInductor packages (.pt2) need libtorch >= " +
                  std::to_string(kMinTorchMajor) + "." + std::to_string(kMinTorchMinor) + "; this build uses libtorch " +
                  std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                  std::to_string(TORCH_VERSION_PATCH) +
                  ", whose package loader crashed the process (segmentation fault) on freshly compiled packages "
                  "(torch 2.11.0); build against a newer torch");
}

c10::Device package_device(const std::string& path) {
  check_libtorch(path);  // before any loading: the loader itself is what crashes
  try {
    const auto metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
    const auto key = metadata.find("AOTI_DEVICE_KEY");
    return c10::Device(key == metadata.end() ? "cpu" : key->second);
  } catch (const c10::Error& error) {
    throw UserError("cannot read the AOTInductor package " + path + ": " + first_line(error));
  }
}

}  // namespace

AotiEngine::AotiEngine(EngineInfo info) : info_(std::move(info)), device_(package_device(info_.path)) {
  if (info_.kind != "aoti") throw UserError(info_.path + " is a " + info_.kind + " engine, not an AOTInductor package");
  try {
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(info_.path, "model");
  } catch (const c10::Error& error) {
    throw UserError("cannot load the AOTInductor package " + info_.path + ": " + first_line(error));
  }
}

AotiEngine::~AotiEngine() = default;

std::string AotiEngine::description() const {
  return "AOTInductor " + info_.precision + " on " + device_.str() + " (" + info_.path + ")";
}

at::Tensor AotiEngine::logits(const at::Tensor& images) {
  std::vector<at::Tensor> outputs = loader_->run({images});
  if (outputs.size() != 1 || outputs[0].dim() != 2 || outputs[0].size(0) != images.size(0) ||
      outputs[0].size(1) != info_.num_classes) {
    throw std::runtime_error("the AOTInductor package " + info_.path + " did not return logits [B, " +
                             std::to_string(info_.num_classes) + "]");
  }
  const at::Tensor logits = outputs[0].to(at::kFloat);
  if (!at::isfinite(logits).all().item<bool>()) throw UserError(kNonFiniteLogits);
  return logits;
}

void AotiEngine::classify(const float* images, std::int64_t batch, std::int64_t* classes) {
  std::vector<std::int64_t> shape{batch};
  shape.insert(shape.end(), info_.input_shape.begin(), info_.input_shape.end());
  const at::Tensor host = at::from_blob(const_cast<float*>(images), shape, at::kFloat);
  const at::Tensor predicted = logits(host.to(device_)).argmax(1).to(at::kCPU).contiguous();
  std::copy_n(predicted.data_ptr<std::int64_t>(), batch, classes);
}

at::Tensor uniform_to_gaussian(const at::Tensor& uniforms) {
  const at::Tensor pairs = uniforms.unflatten(-1, {-1, 2});
  const at::Tensor radius = at::sqrt(at::log(pairs.select(-1, 0)).mul(-2.0));
  const at::Tensor angle = pairs.select(-1, 1).mul(2.0 * 3.14159265358979323846);
  return at::stack({radius.mul(at::cos(angle)), radius.mul(at::sin(angle))}, -1).flatten(-2);
}

TorchSampler::TorchSampler(AotiEngine& engine, std::uint32_t batch) : engine_(engine), batch_(batch) {
  if (batch < 1) throw UserError("batch must be at least 1");
}

std::vector<std::int64_t> TorchSampler::counts(const float* image, std::uint32_t index,
                                               const SamplingPlan& plan, const NoiseSpec& noise) {
  if (noise.sound) return HostSampler(engine_, batch_).counts(image, index, plan, noise);  // integers on the host
  const EngineInfo& info = engine_.info();
  const c10::Device& device = engine_.device();
  const std::int64_t numel = info.numel(), padded = 4 * ((numel + 3) / 4), k = info.num_classes;
  std::vector<std::int64_t> shape{1};
  shape.insert(shape.end(), info.input_shape.begin(), info.input_shape.end());
  const at::Tensor clean = at::from_blob(const_cast<float*>(image), shape, at::kFloat).to(device);
  at::Tensor counts = at::zeros({static_cast<std::int64_t>(plan.sizes.size()) * k},
                                at::TensorOptions().dtype(at::kLong).device(device));
  for (const PlanBatch& batch : plan_batches(plan, batch_)) {
    const auto rows = static_cast<std::int64_t>(batch.size());
    at::Tensor uniforms = at::empty({rows, padded}, at::kFloat);
    at::Tensor stages = at::empty({rows}, at::kLong);
    for (std::int64_t row = 0; row < rows; ++row) {
      uniform_stream(noise.seed, index, plan.phases[batch.stage[row]], batch.sample[row],
                     static_cast<std::size_t>(numel), uniforms.data_ptr<float>() + row * padded);
      stages.data_ptr<std::int64_t>()[row] = batch.stage[row];
    }
    shape[0] = rows;
    const at::Tensor gaussians =
        uniform_to_gaussian(uniforms.to(device)).narrow(1, 0, numel).reshape(shape);
    const at::Tensor predicted = engine_.logits(clean.add(gaussians.mul(noise.sigma))).argmax(1);
    counts.index_add_(0, stages.to(device).mul(k).add(predicted), at::ones_like(predicted));
  }
  const at::Tensor host = counts.to(at::kCPU);
  return {host.data_ptr<std::int64_t>(), host.data_ptr<std::int64_t>() + host.numel()};
}

}  // namespace dmae_smooth
