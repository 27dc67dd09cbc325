"""Can Inductor beat ONNX Runtime as the --fast chunk classifier? Demo model, one thread.

Record of the seventh 2026-11-25 session (issue 12); run from the repository root:

    TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 python bench/experiments/2026-11-25-cpu-fast-inductor-body/inductor_body.py \
        model explicit bmm model-ma bmm-ma > bench/results/2026-11-25-cpu-fast/inductor-body/inductor_body.txt 2>&1

One 128-row chunk of noisy demo inputs, classified back to back for 1.5 s per method, 5 interleaved
rounds (medians): ONNX Runtime (today's --fast body), torch eager, and torch.compile (Inductor,
freezing) of: the timm model (SDPA attention), the same forward with attention written as
broadcast products and sums (for Inductor to fuse), and with attention as two bmm calls; "-ma"
adds mode="max-autotune" (Inductor's C++ GEMM templates compete with MKL). PROFILE=1 adds
torch.profiler tables.
"""
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.cpu_graphs import onnx_bytes
from dmae_fast.engines.cpu_runtimes import OrtChunks
from dmae_fast.model.checkpoints import load_classifier

# Set by main() (module globals, as in the recorded run, so that torch.compile sees the same functions).
CHUNK = T = D = model = chunk = None


def forward(x, attention):
    """timm's forward op by op, with ``attention(q, k, v)`` [R, H, T, Dh] -> [R, H, T, Dh]."""
    t = model.tokens(x)
    R = t.shape[0]
    for blk in model.blocks:
        a = blk.attn
        h = F.layer_norm(t, (D,), blk.norm1.weight, blk.norm1.bias, blk.norm1.eps)
        qkv = F.linear(h, a.qkv.weight, a.qkv.bias).view(R, T, 3, a.num_heads, D // a.num_heads).permute(2, 0, 3, 1, 4)
        o = attention(qkv[0] * a.scale, qkv[1], qkv[2]).permute(0, 2, 1, 3).reshape(R, T, D)
        t = t + F.linear(o, a.proj.weight, a.proj.bias)
        h = F.layer_norm(t, (D,), blk.norm2.weight, blk.norm2.bias, blk.norm2.eps)
        t = t + F.linear(F.gelu(F.linear(h, blk.mlp.fc1.weight, blk.mlp.fc1.bias)),
                         blk.mlp.fc2.weight, blk.mlp.fc2.bias)
    return model.forward_head(model.norm(t))


def explicit(x):
    """Attention as broadcast products and sums, for Inductor to fuse."""
    return forward(x, lambda q, k, v: ((q.unsqueeze(3) * k.unsqueeze(2)).sum(-1).softmax(-1).unsqueeze(-1)
                                       * v.unsqueeze(2)).sum(3))


def bmm_attn(x):
    """Attention as two batched matrix products."""
    return forward(x, lambda q, k, v: (q @ k.transpose(-1, -2)).softmax(-1) @ v)


def main() -> None:
    global CHUNK, T, D, model, chunk
    keep_freed_memory()
    torch.set_num_threads(1)
    CHUNK = int(os.environ.get("CHUNK", 128))
    model = load_classifier(DEMO_CHECKPOINT).eval()
    enc = model.spec.encoder
    T = 1 + (enc.img_size // enc.patch_size) ** 2
    D = enc.embed_dim
    chunk = torch.rand((CHUNK, *model.spec.input_shape), generator=torch.Generator().manual_seed(0))
    chunk = chunk + 0.25 * torch.randn(chunk.shape, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model(chunk)
        for f in (explicit, bmm_attn):
            assert (f(chunk) - want).abs().max() < 1e-4
    import torch._inductor.config as ic  # torch's own setting (freezing)

    ic.freezing = True
    variants = {}
    o = OrtChunks(onnx_bytes(model), "mem")
    variants["ort"] = lambda: o.logits(chunk)
    variants["eager"] = lambda: model(chunk)
    which = sys.argv[1:] or ["model", "explicit", "bmm"]
    for name in which:
        mode = None
        if name.endswith("-ma"):
            mode = "max-autotune"
        base = {"model": model, "explicit": explicit, "bmm": bmm_attn}[name.split("-")[0]]
        c = torch.compile(base, mode=mode, dynamic=False)
        t0 = time.perf_counter()
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = c(chunk)
        print(f"{name}: compile {time.perf_counter()-t0:.0f}s, max diff {float((got-want).abs().max()):.2g}",
              flush=True)
        variants[name] = (lambda c=c: c(chunk))
    rates = {k: [] for k in variants}
    with torch.inference_mode():
        for _ in range(5):
            for k, f in variants.items():
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 1.5:
                    f()
                    n += 1
                rates[k].append(n * CHUNK / (time.perf_counter() - t0))
    for k, v in rates.items():
        m = statistics.median(v)
        print(f"{k:14s} {m:8,.0f}/s {1e6/m:6.1f} us/sample  x ort {m/statistics.median(rates['ort']):.2f}")
    if os.environ.get("PROFILE"):
        from torch.profiler import ProfilerActivity, profile
        for name in which:
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(50):
                    variants[name]()
            print(name)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    main()
