// The TensorRT backend: a serialized engine (.engine / .plan) run with enqueueV3 on a CUDA
// stream; logits come back to the host, where the classes are counted (HostSampler).
// Compiled only when CMake finds NvInfer.h and the CUDA toolkit (DMAE_SMOOTH_WITH_TENSORRT).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "dmae_smooth/engine.h"

namespace nvinfer1 {
class IRuntime;
class ICudaEngine;
class IExecutionContext;
}  // namespace nvinfer1

namespace dmae_smooth {

class TensorRtEngine : public Engine {
 public:
  explicit TensorRtEngine(EngineInfo info);
  ~TensorRtEngine() override;
  const EngineInfo& info() const override { return info_; }
  std::string description() const override;
  void classify(const float* images, std::int64_t batch, std::int64_t* classes) override;

 private:
  void reserve(std::int64_t batch);

  EngineInfo info_;
  std::unique_ptr<nvinfer1::IRuntime> runtime_;
  std::unique_ptr<nvinfer1::ICudaEngine> engine_;
  std::unique_ptr<nvinfer1::IExecutionContext> context_;
  cudaStream_t stream_ = nullptr;
  float* device_images_ = nullptr;
  float* device_logits_ = nullptr;
  std::int64_t capacity_ = 0;  // rows the device buffers hold
  std::vector<float> logits_;
};

}  // namespace dmae_smooth
