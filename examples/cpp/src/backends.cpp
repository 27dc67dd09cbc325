// Which backends this build has: open_engine() and make_sampler() dispatch on them.
#include "dmae_smooth/engine.h"
#include "dmae_smooth/error.h"

#ifdef DMAE_SMOOTH_WITH_TORCH
#include "dmae_smooth/aoti.h"
#endif
#ifdef DMAE_SMOOTH_WITH_TENSORRT
#include "dmae_smooth/tensorrt.h"
#endif

namespace dmae_smooth {

std::unique_ptr<Engine> open_engine(const std::string& engine_path) {
  EngineInfo info = read_engine_info(engine_path);
  if (info.input != "image") {
    throw UserError(engine_path + " is a " + info.input + " engine; the C++ embedding runs image engines "
                    "(export with input \"image\")");
  }
  if (info.kind == "aoti") {
#ifdef DMAE_SMOOTH_WITH_TORCH
    return std::make_unique<AotiEngine>(std::move(info));
#else
    throw UserError(engine_path + ": this build has no libtorch backend for AOTInductor packages");
#endif
  }
  if (info.kind == "tensorrt") {
#ifdef DMAE_SMOOTH_WITH_TENSORRT
    return std::make_unique<TensorRtEngine>(std::move(info));
#else
    throw UserError(engine_path + ": this build has no TensorRT backend (NvInfer.h was not found at build time)");
#endif
  }
  throw UserError(engine_path + ": " + info.kind + " engines are not supported by the C++ embedding "
                  "(use an AOTInductor .pt2 or a TensorRT .engine)");
}

std::unique_ptr<Sampler> make_sampler(Engine& engine, std::uint32_t batch, [[maybe_unused]] bool host) {
#ifdef DMAE_SMOOTH_WITH_TORCH
  if (auto* aoti = dynamic_cast<AotiEngine*>(&engine); aoti != nullptr && !host) {
    return std::make_unique<TorchSampler>(*aoti, batch);
  }
#endif
  return std::make_unique<HostSampler>(engine, batch);
}

}  // namespace dmae_smooth
