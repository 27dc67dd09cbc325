"""Where a GPU batch of a random-weight ViT goes: per-stage time and the top CUDA kernels.

    python bench/experiments/gpu_profile.py --model vit-b16 --batch 1024 [--compile] [--precision fp8] --out DIR

Two views of the same body (fp16 by default, fused front end; eager, or with ``--compile`` the
Inductor kernels that remain after fusion):
1. the StageTimer breakdown (front end, body, counting; each stage synchronized), and
2. torch.profiler's CUDA kernels, grouped into matrix products, attention, normalization,
   elementwise/activation, the noise/front-end kernel, counting and other.
Writes DIR/profile-<model>.txt and .json. Public API only (dmae_fast.bench, dmae_fast.batching).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from dmae_fast import Smoothing
from dmae_fast.batching.fast_body import FastBody, FastPath
from dmae_fast.batching.stage_timer import STAGES, StageTimer
from dmae_fast.bench.throughput import build_model
from dmae_fast.engines.torch_engine import TorchEngine

GROUPS = [  # (group, pattern on the kernel name), first match wins
    ("attention", r"flash|fmha|attention|sdpa|softmax"),
    ("matrix products", r"gemm|sm90_xmma|cutlass|nvjet|cublas|matmul|wgmma|triton_tem|scaled_mm"),
    ("noise + front end", r"fused_frontend|frontend|philox|noise|randn"),
    ("normalization", r"layer_norm|layernorm|norm"),
    ("counting", r"index_put|scatter|argmax|index_add|put_"),
    ("elementwise / activation", r"elementwise|gelu|vectorized|add|mul|copy|cat|triton"),
]


def group_of(name: str) -> str:
    lowered = name.lower()
    return next((group for group, pattern in GROUPS if re.search(pattern, lowered)), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit-b16")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp8"])
    parser.add_argument("--compile", action="store_true", help="torch.compile the body (see what fusion leaves)")
    parser.add_argument("--mode", default="default", help="torch.compile mode with --compile")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    model = build_model(args.model, device)
    engine = TorchEngine(model, device, args.precision)
    timer = StageTimer(device)
    body = FastBody(Smoothing(engine, 0.25, 0, args.batch),
                    FastPath(fused=True, compile=args.compile, compile_mode=args.mode), timer)
    slots = 8
    body.allocate(slots, torch.tensor([1], device=device))
    for slot in range(slots):
        body.load(slot, torch.rand(model.spec.input_shape, device=device))
    slot = torch.arange(args.batch, device=device) % slots
    position = torch.zeros(args.batch, dtype=torch.int64, device=device)
    sample = torch.arange(args.batch, device=device)

    def step() -> None:
        body.run(slot, slot + 1000, position, sample)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    timer.seconds = dict.fromkeys(timer.seconds, 0.0)
    timer.batches = 0
    start = time.perf_counter()
    for _ in range(args.steps):  # the body counts its batches into the timer
        step()
    torch.cuda.synchronize()
    stages = timer.table(time.perf_counter() - start)

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        cuda_us = getattr(event, "self_device_time_total", None)
        if cuda_us is None:
            cuda_us = getattr(event, "self_cuda_time_total", 0.0)
        if cuda_us <= 0 or event.device_type != torch.autograd.DeviceType.CUDA or event.key in STAGES:
            continue  # the stage ranges (record_function) span their kernels: not counted twice
        kernels[event.key] = kernels.get(event.key, 0.0) + cuda_us / 5
        groups[group_of(event.key)] = groups.get(group_of(event.key), 0.0) + cuda_us / 5
    total = sum(groups.values())
    body_kind = f"compiled body ({args.mode})" if args.compile else "eager body"
    lines = [f"{args.model} {args.precision} batch {args.batch}, fused front end, {body_kind}; "
             f"{torch.cuda.get_device_name()}",
             "", "stages (each synchronized):", stages, "", f"CUDA kernel time per batch: {total / 1000:.3f} ms",
             f"{'group':<26} {'ms/batch':>9} {'share':>7}"]
    for group, us in sorted(groups.items(), key=lambda kv: -kv[1]):
        lines.append(f"{group:<26} {us / 1000:>9.3f} {us / total:>7.1%}")
    lines += ["", "top kernels:"]
    for name, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:15]:
        lines.append(f"{us / 1000:>9.3f} ms  {group_of(name):<24} {name[:110]}")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"profile-{args.model}-{args.precision}{'-compiled' if args.compile else ''}"
    (out / f"{stem}.txt").write_text(text + "\n")
    (out / f"{stem}.json").write_text(json.dumps(
        {"model": args.model, "batch": args.batch, "precision": args.precision, "compiled": args.compile,
         "groups_ms": groups,
         "kernels_ms": {k: v / 1000 for k, v in kernels.items()}, "stages": stages}, indent=1))


if __name__ == "__main__":
    main()
