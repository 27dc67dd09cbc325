"""The one interface the certifier needs from a base classifier, whatever runs it."""

from __future__ import annotations

from typing import Protocol

import torch

from dmae_fast.model import ClassifierSpec

INPUT_KINDS = ("image", "tokens")


class Engine(Protocol):
    """A base classifier: noisy inputs -> class indices, on its device.

    ``classify`` takes a float32 batch [B, *input_shape] on ``device`` and returns the
    int64 class indices [B] on the same device, without synchronizing with the host; a
    sample whose logits are not all finite gets the index ``num_classes``
    (:func:`predicted_classes`), which the certifier refuses when it reads the counts.
    Image engines (``input == "image"``) take images in [0, 1] (``input_shape ==
    spec.input_shape``); token engines take ``SmoothingClassifier.tokens(images)``
    ([B, 1 + L, D]), for use behind a fused noise + patch-embedding front end.
    """

    spec: ClassifierSpec
    device: torch.device
    precision: str  # fp32, fp16, bf16 (the certificate is for the classifier as executed)
    description: str
    input: str  # "image" or "tokens"
    input_shape: tuple[int, ...]

    def classify(self, inputs: torch.Tensor) -> torch.Tensor: ...


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """argmax over classes [B]; ``num_classes`` for a row with a NaN or infinite logit.

    argmax of a NaN row is an arbitrary class (often 0), which would be counted as a vote;
    the extra index keeps the evidence on the device until the counts are read.
    """
    finite = torch.isfinite(logits).all(dim=1)
    return torch.where(finite, logits.argmax(dim=1), logits.shape[1])
