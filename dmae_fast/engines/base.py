"""The one interface the certifier needs from a base classifier, whatever runs it, and what an
engine offers beyond it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dmae_fast.engines.sidecar import EngineMeta
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.model.config import ClassifierSpec

INPUT_KINDS = ("image", "tokens")


class Engine:
    """A base classifier: noisy inputs -> class indices, on its device.

    ``classify`` maps a float32 batch [B, *input_shape] on ``device`` to int64 class indices [B] there, without a
    host sync; non-finite logits give ``num_classes`` (:func:`predicted_classes`), which the certifier refuses.
    Image engines take images in [0, 1]; token engines take ``SmoothingClassifier.tokens(images)`` [B, 1 + L, D].
    Optional members (None: not offered): ``model`` (the checkpoint's fp32 classifier), ``path`` and ``meta``."""

    spec: ClassifierSpec
    device: torch.device
    precision: str  # fp32, fp16, bf16, fp8 (the certificate is for the classifier as executed)
    description: str
    input: str  # "image" or "tokens"
    input_shape: tuple[int, ...]
    model: SmoothingClassifier | None = None
    path: Path | None = None
    meta: EngineMeta | None = None

    def classify(self, inputs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def classify_phases(self, inputs: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
        """:meth:`classify` of rows drawn for ``phases`` (each row's :class:`~dmae_fast.stats.plan.Phase` value, as
        the plain body knows them); only an engine that treats the phases differently reads them
        (:class:`~dmae_fast.engines.paired.PairedEngine`)."""
        return self.classify(inputs)

    def token_body(self) -> TokenBody | None:
        """This engine as a body behind a fused front end, where it is a token engine."""
        return None

    def cast_model(self) -> SmoothingClassifier | None:
        """``model`` with its weights in the engine's precision (fp32: ``model`` itself)."""
        return None


@dataclass(frozen=True)
class TokenBody:
    """A token engine behind its front end (a body-less classifier on the engine's device making the tokens
    ``engine.classify`` takes); ``file`` and ``kind``: the engine file and kind (``aoti`` can be graph-captured)."""

    front_end: SmoothingClassifier
    engine: Engine
    file: Path
    kind: str


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """argmax over classes [B]; ``num_classes`` for a row with a NaN or infinite logit (whose argmax would
    be an arbitrary class counted as a vote): the evidence stays on the device until the counts are read."""
    finite = torch.isfinite(logits).all(dim=1)
    return torch.where(finite, logits.argmax(dim=1), logits.shape[1])
