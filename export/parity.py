"""Verification on write: an engine against the fp32 PyTorch model on fresh noisy inputs."""

from __future__ import annotations

import secrets

import torch

from dmae_fast.engines.agreement import compare_logits
from dmae_fast.engines.exported import ExportedEngine
from dmae_fast.engines.sidecar import Parity
from dmae_fast.model.classifier import SmoothingClassifier

THRESHOLDS = {"fp32": 0.999, "fp16": 0.99, "bf16": 0.99}  # minimum top-1 agreement
REFERENCE = "torch fp32 eager"


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
