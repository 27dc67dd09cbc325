"""``--sound`` against the default noise on one body, interleaved (issue 37, item 7).

For each model: noisy samples/s of CERTIFY (n0 + n samples an image) with the fast body's parts asked
for (on CUDA: fused + compiled + CUDA graphs; --sound replaces the fused front end by the unfused one,
with the Triton sound-noise kernel) and with the plain body, default noise and --sound, each ``rounds``
times, interleaved; medians and the ratio sound / default on the same body. Images are 8-bit (on the
1/255 grid; the demo digits on their 1/16). Writes OUT/sound-speed.json and .md.

    python bench/experiments/2026-11-27-sound/sound_speed.py --device cuda --models vit-b16 --out DIR
    python bench/experiments/2026-11-27-sound/sound_speed.py --device cpu --models demo small-32 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from dmae_fast import SamplingPlan, Smoothing, StreamingCertifier
from dmae_fast.batching.bodies import batch_body
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.bench.throughput import build_model
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.noise.sound_options import Sound, default_grid

SIGMA, SEED = 0.25, 0


def measure(model_name: str, device: torch.device, precision: str, batch: int, images: int, n: int,
            rounds: int) -> list[dict]:
    model = build_model(model_name, device)
    engine = TorchEngine(model, device, precision)
    shape = engine.spec.input_shape
    grid = default_grid(model_name == "demo")
    generator = torch.Generator().manual_seed(1)
    pictures = [(i, torch.randint(0, grid + 1, shape, generator=generator) / grid, 0) for i in range(images)]
    fast = BodyOptions(fast=True) if device.type == "cpu" else BodyOptions(fused=True, compile=True, cuda_graphs=True)
    smoothings = {mode: Smoothing(engine, SIGMA, SEED, batch, Sound(grid) if mode else None) for mode in (False, True)}
    bodies = {(name, mode): batch_body(smoothings[mode], options)
              for name, options in (("fast", fast), ("plain", BodyOptions())) for mode in (False, True)}
    plan = SamplingPlan.certify(100, n)
    seconds: dict[tuple[str, bool], list[float]] = {key: [] for key in bodies}
    for round_ in range(rounds + 1):  # the first round warms up (compiles, captures) and is not kept
        for (name, mode), body in bodies.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in StreamingCertifier(smoothings[mode], plan, body).run(pictures):
                pass
            if round_:
                seconds[(name, mode)].append(time.perf_counter() - start)
    samples = images * plan.total
    rows = []
    for (name, mode), body in bodies.items():
        rows.append({"model": model_name, "body": name, "sound": mode, "description": body.description,
                     "samples_per_s": samples / statistics.median(seconds[(name, mode)]),
                     "seconds": seconds[(name, mode)]})
    for row in rows:
        default = next(r for r in rows if r["body"] == row["body"] and not r["sound"])
        row["ratio_to_default"] = row["samples_per_s"] / default["samples_per_s"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", nargs="+", default=["vit-b16"])
    parser.add_argument("--precision", default=None, help="default: fp16 on CUDA, fp32 on a CPU")
    parser.add_argument("--batch", type=int, default=None, help="default: 1024 on CUDA, 1000 on a CPU")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    precision = args.precision or ("fp16" if device.type == "cuda" else "fp32")
    batch = args.batch or (1024 if device.type == "cuda" else 1000)
    rows = [row for model in args.models
            for row in measure(model, device, precision, batch, args.images, args.n, args.rounds)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    record = {"device": name, "torch": torch.__version__, "precision": precision, "batch": batch,
              "images": args.images, "n0": 100, "n": args.n, "rounds": args.rounds, "rows": rows}
    (out / "sound-speed.json").write_text(json.dumps(record, indent=2) + "\n")
    lines = [f"# --sound vs default noise ({name}, torch {torch.__version__}, {precision}, batch {batch})", "",
             "| model | body | noise | samples/s | sound / default |", "| --- | --- | --- | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['body']} | {'--sound' if r['sound'] else 'default'} | {r['samples_per_s']:,.0f} | "
              f"{r['ratio_to_default']:.3f} |" for r in rows]
    (out / "sound-speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
