// Written against the TensorRT 10 C++ API (IRuntime::deserializeCudaEngine,
// IExecutionContext::setInputShape / setTensorAddress / enqueueV3). Not built in this
// project's CI: TensorRT cannot be installed there.
#include "dmae_smooth/tensorrt.h"

#include <NvInfer.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>

#include "dmae_smooth/error.h"

namespace dmae_smooth {
namespace {

class Logger : public nvinfer1::ILogger {
  void log(Severity severity, const char* message) noexcept override {
    if (severity <= Severity::kWARNING) std::cerr << "TensorRT: " << message << "\n";
  }
};

Logger& logger() {
  static Logger instance;  // outlives every runtime
  return instance;
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

}  // namespace

TensorRtEngine::TensorRtEngine(EngineInfo info) : info_(std::move(info)) {
  std::ifstream file(info_.path, std::ios::binary);
  if (!file) throw UserError("cannot read the TensorRT engine " + info_.path);
  const std::vector<char> plan((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  runtime_.reset(nvinfer1::createInferRuntime(logger()));
  if (!runtime_) throw UserError("cannot create a TensorRT runtime");
  engine_.reset(runtime_->deserializeCudaEngine(plan.data(), plan.size()));
  if (!engine_) {
    throw UserError(info_.path + " cannot be deserialized (built by another TensorRT version or for another GPU?)");
  }
  for (const std::string& name : {info_.input_name, info_.output_name}) {
    if (engine_->getTensorIOMode(name.c_str()) == nvinfer1::TensorIOMode::kNONE) {
      throw UserError(info_.path + " has no tensor named \"" + name + "\" (the sidecar says it has)");
    }
    if (engine_->getTensorDataType(name.c_str()) != nvinfer1::DataType::kFLOAT) {
      throw UserError(info_.path + ": tensor \"" + name + "\" is not float32 (the engine contract says it is)");
    }
  }
  context_.reset(engine_->createExecutionContext());
  if (!context_) throw UserError("cannot create a TensorRT execution context for " + info_.path);
  check(cudaStreamCreate(&stream_), "cudaStreamCreate");
}

TensorRtEngine::~TensorRtEngine() {
  cudaFree(device_images_);
  cudaFree(device_logits_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  context_.reset();  // before the engine, the engine before the runtime
  engine_.reset();
  runtime_.reset();
}

std::string TensorRtEngine::description() const {
  return "TensorRT " + info_.precision + " (" + info_.path + ")";
}

void TensorRtEngine::reserve(std::int64_t batch) {
  if (batch <= capacity_) return;
  cudaFree(device_images_);
  cudaFree(device_logits_);
  device_images_ = device_logits_ = nullptr;
  capacity_ = 0;
  check(cudaMalloc(reinterpret_cast<void**>(&device_images_), batch * info_.numel() * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&device_logits_), batch * info_.num_classes * sizeof(float)),
        "cudaMalloc");
  capacity_ = batch;
}

void TensorRtEngine::classify(const float* images, std::int64_t batch, std::int64_t* classes) {
  if (batch > info_.batch_max) {
    throw UserError("batch " + std::to_string(batch) + " exceeds the engine's maximum " +
                    std::to_string(info_.batch_max));
  }
  reserve(batch);
  const std::int64_t k = info_.num_classes;
  check(cudaMemcpyAsync(device_images_, images, batch * info_.numel() * sizeof(float), cudaMemcpyHostToDevice,
                        stream_),
        "cudaMemcpyAsync");
  nvinfer1::Dims dims{};
  dims.nbDims = 1 + static_cast<std::int32_t>(info_.input_shape.size());
  dims.d[0] = batch;
  std::copy(info_.input_shape.begin(), info_.input_shape.end(), dims.d + 1);
  if (!context_->setInputShape(info_.input_name.c_str(), dims) ||
      !context_->setTensorAddress(info_.input_name.c_str(), device_images_) ||
      !context_->setTensorAddress(info_.output_name.c_str(), device_logits_) || !context_->enqueueV3(stream_)) {
    throw std::runtime_error("TensorRT could not run " + info_.path + " on a batch of " + std::to_string(batch));
  }
  logits_.resize(batch * k);
  check(cudaMemcpyAsync(logits_.data(), device_logits_, batch * k * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  for (std::int64_t row = 0; row < batch; ++row) {
    const float* scores = logits_.data() + row * k;
    if (!std::all_of(scores, scores + k, [](float v) { return std::isfinite(v); })) throw UserError(kNonFiniteLogits);
    classes[row] = std::max_element(scores, scores + k) - scores;  // the first maximum, as argmax
  }
}

}  // namespace dmae_smooth
