"""The one interface the certifier needs from a base classifier, whatever runs it."""

from __future__ import annotations

from typing import Protocol

import torch

from dmae_fast.model import ClassifierSpec


class Engine(Protocol):
    """A base classifier: noisy images in [0, 1] -> class indices, on its device.

    ``classify`` takes a float32 batch [B, *spec.input_shape] on ``device`` and returns the
    int64 class indices [B] on the same device, without synchronizing with the host.
    """

    spec: ClassifierSpec
    device: torch.device
    precision: str  # fp32, fp16, bf16 (the certificate is for the classifier as executed)
    description: str

    def classify(self, images: torch.Tensor) -> torch.Tensor: ...
