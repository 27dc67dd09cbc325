"""Verification on write: an engine against the fp32 PyTorch model on fresh noisy inputs."""

from __future__ import annotations

import secrets

import torch

from dmae_fast.data import demo_digits
from dmae_fast.engines.exported import ExportedEngine
from dmae_fast.engines.sidecar import Parity
from dmae_fast.model import SmoothingClassifier

THRESHOLDS = {"fp32": 0.999, "fp16": 0.99, "bf16": 0.99}  # minimum top-1 agreement
DEFAULT_SIGMA = 0.25  # noise level of the inputs when the checkpoint records none
REFERENCE = "torch fp32 eager"


def noisy_inputs(model: SmoothingClassifier, samples: int, seed: int) -> torch.Tensor:
    """Clean images (the demo digits when the shapes match, else uniform noise) + sigma * N(0, I)."""
    spec = model.spec
    generator = torch.Generator().manual_seed(seed)
    demo = demo_digits("test").images
    if tuple(demo.shape[1:]) == spec.input_shape:
        clean = demo[torch.randint(len(demo), (samples,), generator=generator)]
    else:
        clean = torch.rand((samples, *spec.input_shape), generator=generator)
    sigma = spec.sigma if spec.sigma is not None else DEFAULT_SIGMA
    return clean + sigma * torch.randn(clean.shape, generator=generator)


@torch.inference_mode()
def measure_parity(reference: SmoothingClassifier, engine: ExportedEngine, samples: int,
                   seed: int | None = None, batch: int = 256) -> Parity:
    """Max |logit difference| and top-1 agreement of ``engine`` vs ``reference`` (fp32, eager).

    ``reference`` runs on the engine's device; token engines get ``reference.tokens(x)``.
    """
    seed = secrets.randbits(63) if seed is None else seed
    reference = reference.eval().to(engine.device)
    differences, agree = [], 0
    for images in noisy_inputs(reference, samples, seed).split(batch):
        images = images.to(engine.device)
        inputs = images if engine.input == "image" else reference.tokens(images)
        expected = reference(images).float()
        actual = engine.logits(inputs)
        differences.append((actual - expected).abs().max())
        agree += (actual.argmax(1) == expected.argmax(1)).sum().item()
    device = torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu"
    worst = torch.stack(differences).max().item()  # NaN stays NaN
    return Parity(samples, worst, agree / samples, THRESHOLDS[engine.precision], REFERENCE, device, seed)
