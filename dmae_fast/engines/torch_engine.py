"""The PyTorch engine: a checkpoint's classifier run eagerly, optionally under autocast."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from dmae_fast.model import SmoothingClassifier

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class TorchEngine:
    """Runs a :class:`SmoothingClassifier` in inference mode; fp16/bf16 via autocast."""

    def __init__(self, model: SmoothingClassifier, device: torch.device, precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        self.model = model.eval().to(device)
        self.spec = model.spec
        self.device = device
        self.precision = precision
        self.description = f"torch eager {precision} on {device}"

    def _autocast(self):
        dtype = PRECISIONS[self.precision]
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    @torch.inference_mode()
    def classify(self, images: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return self.model(images).argmax(dim=1)
