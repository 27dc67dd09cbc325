"""Where one demo sample's time goes on one core, and how much a 2x-Cohen run could spend.

Record of the fourth 2026-11-25 session (issue 12); run from the repository root:

    python bench/experiments/2026-11-25-cpu-fast-demo-budget/budget.py \
        > bench/results/2026-11-25-cpu-fast/demo-budget/budget.txt

One thread throughout. In one process, interleaved over ``ROUNDS`` rounds (medians):

* Cohen et al.'s loop on the demo model (bench/reference_loops.py), samples/s;
* the demo forward written op by op in torch eager (the same arithmetic as timm's, checked),
  on 128-row chunks, timing each kind of operation;
* ONNX Runtime's per-node profile of the exported demo graph on the same chunks, by kind;
* the four linear layers of a block alone as torch GEMMs (GFLOP/s).

Then the budget: 2x Cohen's loop on T cores leaves T / (2 x Cohen's rate at T threads) seconds
per sample per core; the linear layers at the measured 1024x1024 matmul peak take their FLOPs /
peak of it, and the rest is what attention, GELU, layer norms, adds, front end, head, noise and
counting may spend together.
"""

import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.bench.flops import vit_forward_flops
from dmae_fast.bench.peak import matmul_peak
from dmae_fast.bench.reference_loops import COHEN
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.cpu_graphs import onnx_bytes
from dmae_fast.model.checkpoints import load_classifier

ROUNDS, CHUNK, SECONDS = 5, 128, 2.0


def untimed(_, step):
    return step()


def run_for(step, seconds=SECONDS):
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        calls += 1
    return calls, time.perf_counter() - start


def ort_kind(node: str, op: str) -> str:
    if op in ("MatMul", "Gemm", "FusedMatMul") and "attn/MatMul" in node and "qkv" not in node:
        return "attention"
    if op in ("MatMul", "Gemm", "FusedMatMul"):
        return "linear"
    if op in ("Softmax", "Transpose", "Split", "Squeeze", "Reshape", "Mul") and "/attn/" in node:
        return "attention"
    if op in ("Gelu", "Erf", "BiasGelu") or "/mlp/act/" in node:
        return "GELU"
    if op in ("LayerNormalization", "Add"):
        return "layer norm, adds"
    return "other"


def main() -> None:
    allocator = keep_freed_memory()  # as in dmae-bench cpu: Cohen's loop without page faults every batch
    torch.set_num_threads(1)
    model = load_classifier(DEMO_CHECKPOINT).eval()
    enc = model.spec.encoder
    tokens, width, hidden = 1 + (enc.img_size // enc.patch_size) ** 2, enc.embed_dim, int(enc.embed_dim * enc.mlp_ratio)
    chunk = torch.rand((CHUNK, *model.spec.input_shape), generator=torch.Generator().manual_seed(0))
    image = demo_digits("test")[0][0]

    def eager(x, timer):
        """timm's VisionTransformer forward, op by op (global average pool, exact GELU)."""
        t = timer("front end", lambda: model.tokens(x))
        rows = t.shape[0] * tokens
        t = t.reshape(rows, width)
        for blk in model.blocks:
            a, heads = blk.attn, blk.attn.num_heads
            h = timer("layer norm", lambda: F.layer_norm(t, (width,), blk.norm1.weight, blk.norm1.bias, blk.norm1.eps))
            qkv = timer("linear", lambda: torch.addmm(a.qkv.bias, h, a.qkv.weight.t()))
            q, k, v = qkv.view(-1, tokens, 3, heads, width // heads).permute(2, 0, 3, 1, 4).unbind(0)
            o = timer("attention (SDPA)", lambda: F.scaled_dot_product_attention(q, k, v))
            o = timer("attention (SDPA)", lambda: o.transpose(1, 2).reshape(rows, width))
            t = timer("linear", lambda: torch.addmm(t, o, a.proj.weight.t()).add_(a.proj.bias))
            h = timer("layer norm", lambda: F.layer_norm(t, (width,), blk.norm2.weight, blk.norm2.bias, blk.norm2.eps))
            h = timer("linear", lambda: torch.addmm(blk.mlp.fc1.bias, h, blk.mlp.fc1.weight.t()))
            h = timer("GELU", lambda: F.gelu(h))
            t = timer("linear", lambda: torch.addmm(t, h, blk.mlp.fc2.weight.t()).add_(blk.mlp.fc2.bias))
        return timer("norm, pool, head", lambda: model.forward_head(model.norm(t.view(-1, tokens, width))))

    with torch.inference_mode():
        reference = model(chunk)
        assert torch.allclose(eager(chunk, untimed), reference, atol=1e-4), "op-by-op forward differs from timm's"
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = session_options.inter_op_num_threads = 1
        session_options.log_severity_level = 3
        profiled = ort.SessionOptions()
        profiled.intra_op_num_threads = profiled.inter_op_num_threads = 1
        profiled.log_severity_level = 3
        profiled.enable_profiling = True
        profiled.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
        graph = onnx_bytes(model)
        session = ort.InferenceSession(graph, session_options, providers=["CPUExecutionProvider"])
        assert np.allclose(session.run(None, {"images": chunk.numpy()})[0], reference.numpy(), atol=1e-3)

        rates = defaultdict(list)
        eager_split = defaultdict(list)
        gemm = defaultdict(list)
        shapes = {"qkv": (width, 3 * width), "proj": (width, width), "fc1": (width, hidden), "fc2": (hidden, width)}
        operands = {name: (torch.randn(CHUNK * tokens, k), torch.randn(k, n), torch.randn(n))
                    for name, (k, n) in shapes.items()}
        for _ in range(ROUNDS):
            calls, seconds = run_for(lambda: COHEN.counts(model, image, 400 * 5, 0.25))
            rates["Cohen et al. loop"].append(calls * 2000 / seconds)
            calls, seconds = run_for(lambda: session.run(None, {"images": chunk.numpy()}))
            rates["ONNX Runtime, chunks of 128"].append(calls * CHUNK / seconds)
            spent = defaultdict(float)

            def timer(kind, step):
                start = time.perf_counter()
                out = step()
                spent[kind] += time.perf_counter() - start
                return out
            calls, seconds = run_for(lambda: eager(chunk, timer))
            rates["torch eager op by op, chunks of 128"].append(calls * CHUNK / seconds)
            for kind, value in spent.items():
                eager_split[kind].append(1e6 * value / (calls * CHUNK))
            for name, (x, w, b) in operands.items():
                calls, seconds = run_for(lambda: torch.addmm(b, x, w), 0.5)
                gemm[name].append(2 * x.shape[0] * w.shape[0] * w.shape[1] * calls / seconds / 1e9)

        session = ort.InferenceSession(graph, profiled, providers=["CPUExecutionProvider"])
        for _ in range(200):
            session.run(None, {"images": chunk.numpy()})
        events = json.loads(Path(session.end_profiling()).read_text())
        ort_split = defaultdict(float)
        for event in events:
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                ort_split[ort_kind(event["name"], event["args"]["op_name"])] += event["dur"]
        ort_total = sum(ort_split.values())

    peak = {}
    for threads in (2, 1):
        torch.set_num_threads(threads)
        peak[threads] = matmul_peak(torch.device("cpu"), torch.float32)
    flops = vit_forward_flops(model.spec)
    linear_flops = enc.depth * 2 * tokens * (3 * width * width + width * width + 2 * width * hidden)
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"torch {torch.__version__}, ONNX Runtime {ort.__version__}; one thread; "
          f"medians of {ROUNDS} interleaved rounds; {allocator}")
    print(f"demo forward {flops / 1e6:.3f} MFLOP/sample, of which linear layers {linear_flops / 1e6:.3f} "
          f"({linear_flops / flops:.0%})")
    print(f"fp32 matmul peak (1024x1024): {peak[1] / 1e9:.0f} GFLOP/s on 1 thread, {peak[2] / 1e9:.0f} on 2")
    for name, value in median.items():
        print(f"{name:40s} {value:9,.0f} samples/s  {1e6 / value:6.1f} us/sample  MFU {value * flops / peak[1]:.0%}")
    print("GEMMs of one block on 128x17 rows (torch.addmm), GFLOP/s: "
          + ", ".join(f"{name} {statistics.median(v):.0f}" for name, v in gemm.items()))
    print("torch eager op by op, us/sample:")
    for kind, values in sorted(eager_split.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {kind:20s} {statistics.median(values):6.1f}")
    print("ONNX Runtime node time (200 profiled calls), share:")
    for kind, value in sorted(ort_split.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:20s} {value / ort_total:6.1%}  {value / 200 / CHUNK:6.1f} us/sample")
    cohen = median["Cohen et al. loop"]
    linear_us = 1e6 * linear_flops / peak[1]
    print(f"\nBudget at 2x Cohen's loop (one thread, Cohen {cohen:,.0f}/s): {1e6 / (2 * cohen):.1f} us/sample; "
          f"the linear layers at the peak take {linear_us:.1f}; left for everything else: "
          f"{1e6 / (2 * cohen) - linear_us:.1f} us")
    print(f"(two threads: each core's budget is 2 / (2 x Cohen's 2-thread rate from dmae-bench cpu), "
          f"the same {linear_us:.1f} us of it for the linear layers)")


if __name__ == "__main__":
    main()
