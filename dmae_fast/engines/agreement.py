"""Logits of an engine or a runtime against the fp32 PyTorch model, on noisy inputs: the measurement
behind the exporter's parity figures (:mod:`dmae_fast.export.parity`) and the CPU fast path's check of
a graph it exported in memory (:mod:`dmae_fast.batching.cpu.exported`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from dmae_fast.data import demo_digits
from dmae_fast.model.classifier import SmoothingClassifier

DEFAULT_SIGMA = 0.25  # noise level of the inputs when the checkpoint records none
BATCH_BYTES = 1 << 28  # float32 images per verification batch: 256 MiB (a ViT-B at 224: 256 images)


def noisy_batches(model: SmoothingClassifier, samples: int, seed: int, batch: int,
                  sigma: float | None = None) -> Iterator[torch.Tensor]:
    """``samples`` clean images (the demo digits when the shapes match, else uniform noise) + sigma * N(0, I)
    (``sigma``, else the checkpoint's, else 0.25), drawn ``batch`` at a time from one generator."""
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
    """(max |logit difference|, top-1 agreement) of ``logits(inputs(x))`` against ``reference(x)`` (fp32, eager, on
    ``device``) over ``samples`` noisy images x of :func:`noisy_batches` (at most BATCH_BYTES at a time); NaN stays."""
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
