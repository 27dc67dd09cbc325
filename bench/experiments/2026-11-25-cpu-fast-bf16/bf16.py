"""bf16 on this CPU (AVX512-BF16): one thread, one chunk, interleaved rounds, medians; top-1 agreement with fp32 eager.

Record of the fifth 2026-11-25 session (issue 12); run from the repository root:
    python bench/experiments/2026-11-25-cpu-fast-bf16/bf16.py demo; python ... small-224
(output: bench/results/2026-11-25-cpu-fast/bf16/bf16.txt)
"""
import copy
import statistics
import sys
import time

import torch

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.bench.throughput import build_model
from dmae_fast.data import demo_digits
from dmae_fast.engines.cpu_graphs import onnx_bytes
from dmae_fast.engines.cpu_runtimes import OrtChunks


def main(name: str) -> None:
    import torch._inductor.config as icfg  # torch's own setting (freezing), not a dmae_fast internal

    keep_freed_memory()
    torch.set_num_threads(1)
    CH = 128 if name == "demo" else 16
    model = build_model(name, torch.device("cpu"))
    if name == "demo":
        d = demo_digits("test").images
        x = (d[torch.arange(CH) % len(d)] + 0.25 * torch.randn(CH, *model.spec.input_shape)).float()
    else:
        x = torch.rand(CH, *model.spec.input_shape) + 0.25 * torch.randn(CH, *model.spec.input_shape)
    m16 = copy.deepcopy(model).bfloat16().eval()
    def autocast(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)
    def castall(x): return m16(x.bfloat16())
    icfg.freezing = True
    opts = {"cpp.threads": 1, "cpp_wrapper": True}
    with torch.no_grad():
        comp16 = torch.compile(m16, options=opts, dynamic=False)
        comp16(x.bfloat16())
        comp32 = torch.compile(model, options=opts, dynamic=False)
        comp32(x)
        ref = model(x).argmax(1)
        ort = OrtChunks(onnx_bytes(model), "in memory")
        V = {"fp32 ONNX Runtime (--fast)": lambda: ort.logits(x), "fp32 eager": lambda: model(x),
             "bf16 autocast": lambda: autocast(x), "bf16 weights eager": lambda: castall(x),
             "bf16 compiled": lambda: comp16(x.bfloat16()), "fp32 compiled": lambda: comp32(x)}
        for k, f in V.items():
            print(k, "top-1 agreement with fp32", (f().argmax(1) == ref).float().mean().item())
        def rate(f, s=1.0):
            n = 0
            t = time.perf_counter()
            while time.perf_counter() - t < s:
                f()
                n += 1
            return n * CH / (time.perf_counter() - t)
        R = {k: [] for k in V}
        for r in range(5):
            for k, f in V.items():
                R[k].append(rate(f))
        for k, v in R.items():
            print(f"{k:28s} {statistics.median(v):8,.0f} samples/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo")
