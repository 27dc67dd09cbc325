"""DMAE pre-training throughput: training images/s of the real step on random images.

    python -m dmae_fast.bench.train_throughput --out DIR [--preset dmae-vitb-pretrain]
                                               [--batch 256] [--precision bf16] [--seconds 30]

One step is what ``dmae-train pretrain`` does per batch: per-sample Philox noise and masks,
the DMAE forward (encoder on the 25% visible patches, decoder on all), the loss over all
patches, backward and AdamW, under bf16 autocast (or fp16 with a gradient scaler, or fp32).
Images are random (speed does not depend on their content). Writes
DIR/<date>-<device>-pretrain.json and .md (numbered, never overwritten); nothing is
claimed on a CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dmae_fast.base.command import Parser, run_reporting_errors
from dmae_fast.base.errors import UserError
from dmae_fast.bench.report import result_stem
from dmae_fast.engines.opening import resolve_device
from dmae_fast.export.config import device_problem
from dmae_fast.export.pipeline import writable_directory
from dmae_fast.model.config import NORMALIZATIONS
from dmae_fast.train.config import PretrainConfig, resolve
from dmae_fast.train.optim import build_optimizer, param_groups
from dmae_fast.train.pretrain import build_pretrain_model, pretrain_loss

PROG = "dmae-bench-train"
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
MAX_BATCH = 2**16  # images per step; far beyond any device's memory at 224x224


@dataclass(frozen=True)
class TrainThroughput:
    preset: str
    encoder: str
    precision: str
    batch: int
    steps: int
    seconds: float
    images_per_s: float
    peak_memory_gib: float | None
    final_loss: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(config: PretrainConfig, batch: int, precision: str, seconds: float, device: torch.device,
            warmup: int = 3) -> TrainThroughput:
    """Time pre-training steps for ``seconds`` after ``warmup`` steps."""
    # "dataset" normalization uses the training images' statistics; for speed any values do
    mean, std = NORMALIZATIONS.get(config.data.normalization, NORMALIZATIONS["imagenet"])
    model = build_pretrain_model(config, mean, std).to(device).train()
    optimizer = build_optimizer(param_groups(model, config.optim.weight_decay), config.optim)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    size = config.encoder_config.img_size
    images = torch.rand(batch, 3, size, size, device=device)
    dtype = AUTOCAST[precision]

    def step(index: int) -> float:
        ids = torch.arange(index * batch, (index + 1) * batch, device=device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = pretrain_loss(model, config, images, ids, epoch=0)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for i in range(warmup):
        step(i)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    steps, start = 0, time.perf_counter()
    while True:
        loss = step(warmup + steps)
        steps += 1
        if steps % 5 == 0 or device.type != "cuda":
            _sync(device)
            if time.perf_counter() - start >= seconds:
                break
    elapsed = time.perf_counter() - start
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return TrainThroughput(preset="", encoder=config.encoder, precision=precision, batch=batch, steps=steps,
                           seconds=round(elapsed, 3), images_per_s=steps * batch / elapsed,
                           peak_memory_gib=memory, final_loss=float(loss))


def _check(args: argparse.Namespace) -> None:
    """One line for a bad option, before the model is built (a NaN or infinite --seconds
    would time forever)."""
    if not 1 <= args.batch <= MAX_BATCH:
        raise UserError(f"--batch must be in [1, {MAX_BATCH:,}], got {args.batch}")
    if not (math.isfinite(args.seconds) and args.seconds > 0):
        raise UserError(f"--seconds must be a finite number > 0, got {args.seconds}")
    if problem := device_problem(args.device):
        raise UserError(problem)


def run(args: argparse.Namespace) -> int:
    _check(args)
    device = resolve_device(args.device)
    config = resolve("pretrain", args.preset, [])  # one-line error for another subcommand's preset
    config = replace(config, optim=replace(config.optim, precision=args.precision))
    out = writable_directory(Path(args.out), "--out")  # before minutes of timing, not after
    result = replace(measure(config, args.batch, args.precision, args.seconds, device), preset=args.preset)
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    stem = out / result_stem(out, device, "-pretrain")
    record = {"device": label, "torch": torch.__version__, "result": asdict(result)}
    Path(f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    memory = "" if result.peak_memory_gib is None else f"{result.peak_memory_gib:.1f}"
    table = ("| preset | encoder | precision | batch | steps | images/s | peak memory (GiB) | device | torch |\n"
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |\n"
             f"| {result.preset} | {result.encoder} | {result.precision} | {result.batch} | {result.steps} | "
             f"{result.images_per_s:,.1f} | {memory} | {label} | {torch.__version__} |\n")
    Path(f"{stem}.md").write_text(table)
    print(table, end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="DMAE pre-training throughput (training images/s) on random images.")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--preset", default="dmae-vitb-pretrain", help="a pre-training preset of dmae-train")
    parser.add_argument("--batch", type=int, default=256, help="images per optimizer step")
    parser.add_argument("--precision", choices=sorted(AUTOCAST), default="bf16")
    parser.add_argument("--seconds", type=float, default=30.0, help="timed seconds after 3 warm-up steps")
    parser.add_argument("--device", default="auto")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_reporting_errors(PROG, lambda: run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
