// Embedding dmae_smooth: certify one image of a .npy file with an engine file.
//
//   certify-one model.pt2 images.npy 0
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "dmae_smooth/certify.h"
#include "dmae_smooth/engine.h"
#include "dmae_smooth/npy.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: certify-one ENGINE IMAGES.npy INDEX\n");
    return 2;
  }
  try {
    auto engine = dmae_smooth::open_engine(argv[1]);  // reads argv[1] + ".json" too
    const dmae_smooth::NpyArray images = dmae_smooth::read_npy(argv[2]);
    const long index = std::atol(argv[3]);
    if (images.dtype != "<f4" || index < 0 || index >= (images.shape.empty() ? 0 : images.shape[0])) {
      throw std::runtime_error("no float32 image " + std::string(argv[3]) + " in " + argv[2]);
    }
    const float* image = images.f32.data() + index * engine->info().numel();

    auto sampler = dmae_smooth::make_sampler(*engine, /*batch=*/1000);
    dmae_smooth::Smoother smoother(*sampler, {/*sigma=*/engine->info().sigma.value_or(0.25), /*seed=*/0});
    const dmae_smooth::Certificate c = smoother.certify(image, static_cast<std::uint32_t>(index),
                                                        /*n0=*/100, /*n=*/10000, /*alpha=*/0.001);
    if (c.prediction == dmae_smooth::kAbstain) {
      std::printf("abstain (pA_lower %.4f)\n", c.p_a_lower);
    } else {
      std::printf("class %ld certified within L2 radius %.3f\n", static_cast<long>(c.prediction), c.radius);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "certify-one: %s\n", error.what());
    return 1;
  }
  return 0;
}
