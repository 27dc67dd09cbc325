"""Verification on write: an engine against the fp32 PyTorch model on fresh noisy inputs."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterator

import torch

from dmae_fast.data import demo_digits
from dmae_fast.engines.exported import ExportedEngine
from dmae_fast.engines.sidecar import Parity
from dmae_fast.model import SmoothingClassifier

THRESHOLDS = {"fp32": 0.999, "fp16": 0.99, "bf16": 0.99}  # minimum top-1 agreement
DEFAULT_SIGMA = 0.25  # noise level of the inputs when the checkpoint records none
REFERENCE = "torch fp32 eager"
BATCH_BYTES = 1 << 28  # float32 images per verification batch: 256 MiB (a ViT-B at 224: 256 images)


def noisy_batches(model: SmoothingClassifier, samples: int, seed: int, batch: int,
                  sigma: float | None = None) -> Iterator[torch.Tensor]:
    """``samples`` clean images (the demo digits when the shapes match, else uniform noise)
    + sigma * N(0, I) (``sigma``, else the checkpoint's, else 0.25), drawn ``batch`` at a time
    from one generator: memory stays one batch whatever --parity-samples says."""
    spec = model.spec
    generator = torch.Generator().manual_seed(seed)
    demo = demo_digits("test").images
    digits = tuple(demo.shape[1:]) == spec.input_shape
    if sigma is None:
        sigma = spec.sigma if spec.sigma is not None else DEFAULT_SIGMA
    for start in range(0, samples, batch):
        size = min(batch, samples - start)
        if digits:
            clean = demo[torch.randint(len(demo), (size,), generator=generator)]
        else:
            clean = torch.rand((size, *spec.input_shape), generator=generator)
        yield clean + sigma * torch.randn(clean.shape, generator=generator)


@torch.inference_mode()
def compare_logits(reference: SmoothingClassifier, logits: Callable[[torch.Tensor], torch.Tensor], samples: int,
                   seed: int, batch: int = 256, sigma: float | None = None,
                   inputs: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """(max |logit difference|, top-1 agreement) of ``logits(inputs(x))`` against ``reference(x)``
    (fp32, eager, on ``device``) over ``samples`` noisy images x of :func:`noisy_batches`; NaN
    stays NaN. Batches shrink for large inputs (at most BATCH_BYTES of images at a time)."""
    reference = reference.eval().to(device)
    batch = max(1, min(batch, BATCH_BYTES // (4 * math.prod(reference.spec.input_shape))))
    differences, agree = [], 0
    for images in noisy_batches(reference, samples, seed, batch, sigma):
        images = images.to(device)
        expected = reference(images).float()
        actual = logits(images if inputs is None else inputs(images))
        differences.append((actual - expected).abs().max())
        agree += (actual.argmax(1) == expected.argmax(1)).sum().item()
    return torch.stack(differences).max().item(), agree / samples


def measure_parity(reference: SmoothingClassifier, engine: ExportedEngine, samples: int,
                   seed: int | None = None, batch: int = 256) -> Parity:
    """Max |logit difference| and top-1 agreement of ``engine`` vs ``reference`` (fp32, eager).

    ``reference`` runs on the engine's device; token engines get ``reference.tokens(x)``.
    """
    seed = secrets.randbits(63) if seed is None else seed
    inputs = None if engine.input == "image" else reference.to(engine.device).tokens
    worst, agreement = compare_logits(reference, engine.logits, samples, seed, batch, inputs=inputs,
                                      device=engine.device)
    device = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu"
    return Parity(samples, worst, agreement, THRESHOLDS[engine.precision], REFERENCE, device, seed)
