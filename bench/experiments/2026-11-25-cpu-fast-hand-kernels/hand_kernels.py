"""Would plain C++ attention and GELU kernels make a PyTorch chunk body faster? Demo model, one thread.

Record of the seventh 2026-11-25 session (issue 12); run from the repository root:

    python bench/experiments/2026-11-25-cpu-fast-hand-kernels/hand_kernels.py \
        > bench/results/2026-11-25-cpu-fast/hand-kernels/hand_kernels.txt 2>&1

Two kernels written the simple way (loops the compiler vectorizes: -O3 -march=native -ffast-math,
glibc's libmvec for expf/erff): the 17-token attention of one chunk read straight from the qkv GEMM's
output, and an in-place exact GELU. Timed alone against torch's SDPA and GELU on the demo's
shapes (128-row chunks, 4 blocks), then inside an op-by-op forward (torch.addmm linear layers),
against ONNX Runtime and Cohen's loop, 5 interleaved rounds of 1.5 s (medians).
"""
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.bench.reference_loops import COHEN
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.cpu_graphs import onnx_bytes
from dmae_fast.engines.cpu_runtimes import OrtChunks
from dmae_fast.model.checkpoints import load_classifier

SRC = r'''
#include <torch/extension.h>
#include <cmath>
#include <vector>
#include <limits>
torch::Tensor attention(torch::Tensor qkv, int64_t T, int64_t H, double scale_d) {
  const int64_t rows = qkv.size(0), D3 = qkv.size(1), D = D3 / 3, Dh = D / H, R = rows / T;
  const float scale = (float)scale_d;
  auto out = torch::empty({rows, D}, qkv.options());
  const float* a = qkv.data_ptr<float>();
  float* o = out.data_ptr<float>();
  std::vector<float> s(T);
  for (int64_t r = 0; r < R; ++r) {
    const float* base = a + r * T * D3;
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const float* q = base + i * D3 + h * Dh;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          const float* k = base + j * D3 + D + h * Dh;
          float acc = 0.f;
          #pragma omp simd reduction(+:acc)
          for (int64_t d = 0; d < Dh; ++d) acc += q[d] * k[d];
          s[j] = acc * scale;
          m = s[j] > m ? s[j] : m;
        }
        float sum = 0.f;
        #pragma omp simd reduction(+:sum)
        for (int64_t j = 0; j < T; ++j) { s[j] = expf(s[j] - m); sum += s[j]; }
        const float inv = 1.f / sum;
        float* oi = o + (r * T + i) * D + h * Dh;
        #pragma omp simd
        for (int64_t d = 0; d < Dh; ++d) oi[d] = 0.f;
        for (int64_t j = 0; j < T; ++j) {
          const float* v = base + j * D3 + 2 * D + h * Dh;
          const float p = s[j] * inv;
          #pragma omp simd
          for (int64_t d = 0; d < Dh; ++d) oi[d] += p * v[d];
        }
      }
    }
  }
  return out;
}
torch::Tensor gelu_(torch::Tensor x) {
  float* p = x.data_ptr<float>();
  const int64_t n = x.numel();
  #pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] = 0.5f * p[i] * (1.f + erff(p[i] * 0.70710678118654752f));
  return x;
}
'''


def main() -> None:
    ext = load_inline("dmae_hand_kernels_record", cpp_sources=SRC, functions=["attention", "gelu_"],
                      extra_cflags=["-O3", "-march=native", "-fopenmp-simd", "-ffast-math"], extra_ldflags=["-lmvec"],
                      verbose=False)
    keep_freed_memory()
    torch.set_num_threads(1)
    CHUNK = 128
    model = load_classifier(DEMO_CHECKPOINT).eval()
    enc = model.spec.encoder
    T = 1 + (enc.img_size // enc.patch_size) ** 2
    D = enc.embed_dim
    chunk = torch.rand((CHUNK, *model.spec.input_shape), generator=torch.Generator().manual_seed(0))
    chunk = chunk + 0.25 * torch.randn(chunk.shape, generator=torch.Generator().manual_seed(1))
    W = [(b, b.attn.qkv.weight.t().contiguous(), b.attn.proj.weight.t().contiguous(), b.mlp.fc1.weight.t().contiguous(),
          b.mlp.fc2.weight.t().contiguous()) for b in model.blocks]

    def body(x, hand):
        t = model.tokens(x)
        R = t.shape[0]
        t = t.reshape(R * T, D)
        for blk, wqkv, wproj, w1, w2 in W:
            a = blk.attn
            h = F.layer_norm(t, (D,), blk.norm1.weight, blk.norm1.bias, blk.norm1.eps)
            qkv = torch.addmm(a.qkv.bias, h, wqkv)
            if hand:
                o = ext.attention(qkv, T, a.num_heads, a.scale)
            else:
                q, k, v = qkv.view(R, T, 3, a.num_heads, D // a.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
                o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(R * T, D)
            t = torch.addmm(t, o, wproj).add_(a.proj.bias)
            h = F.layer_norm(t, (D,), blk.norm2.weight, blk.norm2.bias, blk.norm2.eps)
            h = torch.addmm(blk.mlp.fc1.bias, h, w1)
            h = ext.gelu_(h) if hand else F.gelu(h)
            t = torch.addmm(t, h, w2).add_(blk.mlp.fc2.bias)
        return model.forward_head(model.norm(t.view(R, T, D)))

    def per_sample_us(step, calls=300):
        step()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        return (time.perf_counter() - start) / calls * 1e6 / CHUNK * enc.depth  # a chunk's call, once per block

    with torch.inference_mode():
        heads = model.blocks[0].attn.num_heads
        qkv = torch.randn(CHUNK * T, 3 * D, generator=torch.Generator().manual_seed(3))
        hidden = torch.randn(CHUNK * T, int(D * enc.mlp_ratio), generator=torch.Generator().manual_seed(4))

        def sdpa():
            q, k, v = qkv.view(CHUNK, T, 3, heads, D // heads).permute(2, 0, 3, 1, 4).unbind(0)
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(CHUNK * T, D)

        scale = (D // heads) ** -0.5
        assert (ext.attention(qkv, T, heads, scale) - sdpa()).abs().max() < 1e-5
        assert (ext.gelu_(hidden.clone()) - F.gelu(hidden)).abs().max() < 1e-5
        print(f"attention, us/sample (4 blocks): torch SDPA {per_sample_us(sdpa):.1f}, "
              f"C++ {per_sample_us(lambda: ext.attention(qkv, T, heads, scale)):.1f}")
        clone = per_sample_us(lambda: hidden.clone())
        print(f"GELU, us/sample (4 blocks): torch {per_sample_us(lambda: F.gelu(hidden)):.1f}, "
              f"C++ {per_sample_us(lambda: ext.gelu_(hidden.clone())) - clone:.1f} (its input copy subtracted)")
        want = model(chunk)
        for hand in (False, True):
            print("C++ kernels" if hand else "torch ops", "forward: logits within",
                  f"{float((body(chunk, hand) - want).abs().max()):.1g} of the model's")
        o = OrtChunks(onnx_bytes(model), "mem")
        image = demo_digits("test")[0][0]
        variants = {"cohen": None, "ort": lambda: o.logits(chunk), "torch ops": lambda: body(chunk, False),
                    "C++ kernels": lambda: body(chunk, True)}
        rates = {k: [] for k in variants}
        for _ in range(5):
            for k, f in variants.items():
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 1.5:
                    if f is None:
                        COHEN.counts(model, image, 2000, 0.25)
                        n += 2000 / CHUNK
                    else:
                        f()
                        n += 1
                rates[k].append(n * CHUNK / (time.perf_counter() - t0))
    for k, v in rates.items():
        m = statistics.median(v)
        print(f"{k:10s} {m:8,.0f}/s {1e6 / m:6.1f} us/sample  x Cohen {m / statistics.median(rates['cohen']):.2f}  "
              f"x ORT {m / statistics.median(rates['ort']):.2f}")


if __name__ == "__main__":
    main()
