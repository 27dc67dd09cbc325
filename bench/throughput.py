"""Noisy samples per second, end to end (noise + forward + counting), for one row of the table.

Each measurement warms up (compilation, CUDA-graph capture, autotuning happen there), then
repeats full batches for a fixed time and synchronizes; the rate is batch * steps / time.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from dmae_fast.batching.fast_body import FastBody, FastPath
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody
from dmae_fast.bench.config import MODEL_SPECS
from dmae_fast.bench.flops import vit_forward_flops
from dmae_fast.bench.reference_loops import ReferenceLoop
from dmae_fast.demo_files import DEMO_CHECKPOINT
from dmae_fast.engines.base import Engine
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.model.classifier import SmoothingClassifier

SIGMA, SEED, SLOTS = 0.25, 0, 8


def build_model(name: str, device: torch.device) -> SmoothingClassifier:
    """'demo' (the shipped checkpoint) or one of MODEL_SPECS with random weights, in eval mode."""
    if name == "demo":
        return load_classifier(DEMO_CHECKPOINT).eval().to(device)
    with torch.device(device):
        return SmoothingClassifier(MODEL_SPECS[name]).eval()


@dataclass(frozen=True)
class Variant:
    """One way of producing counts: a reference loop, our fast body (on the model, or on an
    exported token engine when ``engine`` is set too), or an exported engine alone."""

    name: str
    precision: str
    fast: FastPath | None = None
    reference: ReferenceLoop | None = None
    engine: Engine | None = None

    @property
    def needs_cuda(self) -> bool:
        return self.fast is not None and self.fast.cuda_graphs


@dataclass
class Row:
    model: str
    variant: str
    precision: str
    batch: int
    status: str = "ok"  # ok, skipped: <why>, out of memory, failed: <why>
    samples_per_s: float | None = None
    mfu: float | None = None
    memory_gib: float | None = None
    vs_cohen: float | None = None
    vs_dmae: float | None = None
    seconds: float | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(step: Callable[[], None], samples: int, seconds: float, device: torch.device) -> float:
    for _ in range(2):  # warm-up: compilation, graph capture
        step()
    _sync(device)
    steps, start = 0, time.perf_counter()
    while steps < 2 or time.perf_counter() - start < seconds:
        step()
        steps += 1
        if steps % 8 == 0:  # keep the host at most a few batches ahead of the device
            _sync(device)
    _sync(device)
    return samples * steps / (time.perf_counter() - start)


def _body_step(body, batch: int, shape: tuple[int, ...], device: torch.device) -> Callable[[], None]:
    """Load SLOTS random images into ``body``; one step = one full batch drawn from all of them."""
    body.allocate(SLOTS, torch.tensor([1], device=device))
    for slot in range(SLOTS):
        body.load(slot, torch.rand(shape, device=device))
    slot = torch.arange(batch, device=device) % SLOTS
    position = torch.zeros(batch, dtype=torch.int64, device=device)
    sample = torch.arange(batch, device=device)
    return lambda: body.run(slot, slot + 1000, position, sample)


def measure(model_name: str, model: SmoothingClassifier, variant: Variant, batch: int, seconds: float,
            peak_flops: float) -> Row:
    """One row: samples/s, MFU against ``peak_flops``, peak device memory (ratios filled later)."""
    device = next(model.parameters()).device
    row = Row(model_name, variant.name, variant.precision, batch)
    if variant.needs_cuda and device.type != "cuda":
        row.status = "skipped: needs CUDA"
        return row
    if device.type == "cuda":
        gc.collect()  # earlier rows' bodies hold themselves (bound methods): free their buffers first
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    shape = model.spec.input_shape
    begin = time.perf_counter()
    try:
        if variant.reference is not None:
            image = torch.rand(shape, device=device)
            rate = _rate(lambda: variant.reference.counts(model, image, batch, SIGMA), batch, seconds, device)
        else:
            if variant.fast is None:
                body = PlainBody(Smoothing(variant.engine, SIGMA, SEED, batch))
            else:
                engine = variant.engine or TorchEngine(model, device, variant.precision)
                body = FastBody(Smoothing(engine, SIGMA, SEED, batch), variant.fast)
                if replace(body.options, compile_mode=variant.fast.compile_mode) != variant.fast:  # a mode may change
                    row.status = f"skipped: {variant.name} not available for this model (see notice)"
                    return row
            rate = _rate(_body_step(body, batch, shape, device), batch, seconds, device)
    except torch.cuda.OutOfMemoryError:
        row.status = "out of memory"
        torch.cuda.empty_cache()
        return row
    row.samples_per_s = rate
    row.mfu = rate * vit_forward_flops(model.spec) / peak_flops if peak_flops > 0 else None
    if device.type == "cuda":
        row.memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    row.seconds = time.perf_counter() - begin
    return row


def add_ratios(rows: list[Row]) -> None:
    """Each row's samples/s over the two reference loops' (same model) rates."""
    for model in {r.model for r in rows}:
        def best(name: str) -> float | None:
            rates = [r.samples_per_s for r in rows if r.model == model and r.variant == name and r.samples_per_s]
            return max(rates) if rates else None

        cohen, dmae = best("reference: Cohen et al."), best("reference: DMAE")
        for r in rows:
            if r.model == model and r.samples_per_s:
                r.vs_cohen = r.samples_per_s / cohen if cohen else None
                r.vs_dmae = r.samples_per_s / dmae if dmae else None


def is_finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
