"""End-to-end CERTIFY timing (n0 selection + n estimation samples per image), extrapolated.

The reference loops certify one image at a time until their time budget is spent (at
least one image); ours streams all images through the fast body. Per-image time times
1,000 is the extrapolation to the paper's ImageNet protocol (1,000 images).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dmae_fast.batching.fast_body import FastBody, FastPath
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.bench.config import PAPER_IMAGES
from dmae_fast.bench.reference_loops import ReferenceLoop
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.stats.procedure import Procedure


@dataclass
class CertifyTiming:
    model: str
    method: str
    precision: str
    batch: int
    n0: int
    n: int
    images: int
    seconds: float
    per_image_s: float
    extrapolated_1000_s: float
    samples_per_s: float


def _timing(model: str, method: str, precision: str, batch: int, n0: int, n: int, images: int,
            seconds: float) -> CertifyTiming:
    per_image = seconds / images
    return CertifyTiming(model, method, precision, batch, n0, n, images, seconds, per_image,
                         per_image * PAPER_IMAGES, images * (n0 + n) / seconds)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_reference(name: str, model: SmoothingClassifier, loop: ReferenceLoop, images: list[torch.Tensor],
                   n0: int, n: int, sigma: float, budget_s: float) -> CertifyTiming:
    device = next(model.parameters()).device
    loop.counts(model, images[0], min(n0, loop.batch_size), sigma)  # warm-up
    _sync(device)
    start, done = time.perf_counter(), 0
    for image in images:
        loop.counts(model, image, n0, sigma)
        loop.counts(model, image, n, sigma)
        done += 1
        if time.perf_counter() - start > budget_s:
            break
    _sync(device)
    return _timing(name, loop.name, loop.precision, loop.batch_size, n0, n, done, time.perf_counter() - start)


def time_ours(name: str, model: SmoothingClassifier, fast: FastPath, precision: str, batch: int,
              images: list[torch.Tensor], n0: int, n: int, sigma: float,
              sequential: Procedure | None = None) -> CertifyTiming:
    """The streaming certifier over all images, after a one-image warm-up run of the same plan
    (it compiles and captures the CUDA graph that the timed run replays); with a ``sequential``
    procedure (what ``--sequential`` runs), its plan and stopping rule (--n is the cap;
    samples/s counts samples drawn)."""
    device = next(model.parameters()).device
    smoothing = Smoothing(TorchEngine(model, device, precision), sigma, 0, batch)
    body = FastBody(smoothing, fast)
    plan, decide = (SamplingPlan.certify(n0, n), None) if sequential is None else (sequential.plan, sequential.decide)

    def run(items):
        return list(StreamingCertifier(smoothing, plan, body).run(items, decide))

    run([(0, images[0].cpu(), 0)])
    _sync(device)
    start = time.perf_counter()
    out = run([(i, image.cpu(), 0) for i, image in enumerate(images)])
    drawn = sum(int(done.counts.sum()) for done in out)
    _sync(device)
    method = f"ours: {body.options.describe()}" + (f", {sequential.name}" if sequential else "")
    timing = _timing(name, method, precision, batch, n0, n, len(out), time.perf_counter() - start)
    timing.samples_per_s = drawn / timing.seconds
    return timing
