"""A reference classifier and one derived from it (an fp16, fp8 or int8 engine of the same checkpoint) as one engine
over class pairs: a noisy input's class is reference class * C + derived class (C classes), so that the certifier's
class counts of the same noisy inputs are the two classifiers' joint table, from which incremental certification
reads the disagreements (:mod:`dmae_fast.stats.incremental`, docs/certify.md). Behind the plain body, only the rows
of the paired phase run the reference: the other rows (an image certified from scratch) count the derived class
alone, as the pair (0, derived class)."""

from __future__ import annotations

import dataclasses

import torch

from dmae_fast.base.errors import raise_first
from dmae_fast.engines.base import Engine
from dmae_fast.stats.plan import PAIRED


class PairedEngine(Engine):
    """``reference`` and ``derived`` on the same noisy inputs; a pair with a non-finite side counts as non-finite."""

    def __init__(self, reference: Engine, derived: Engine) -> None:
        raise_first([
            (reference.input == derived.input == "image", "both engines must take images (token engines run only "
                                                          "behind the fast body's front end)"),
            (reference.spec.num_classes == derived.spec.num_classes,
             f"the reference has {reference.spec.num_classes} classes, the derived engine "
             f"{derived.spec.num_classes}"),
            (reference.input_shape == derived.input_shape,
             f"the reference takes inputs of shape {reference.input_shape}, the derived engine {derived.input_shape}"),
            (reference.device == derived.device,
             f"the reference runs on {reference.device}, the derived engine on {derived.device}"),
        ], prefix="cannot pair the engines: ")
        self.reference, self.derived, self.classes = reference, derived, reference.spec.num_classes
        self.spec = dataclasses.replace(reference.spec, num_classes=self.classes ** 2, class_names=None)
        self.device, self.input, self.input_shape = reference.device, "image", reference.input_shape
        self.precision = derived.precision
        self.description = f"paired: {reference.description} (reference) | {derived.description} (derived)"

    def classify(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._pairs(self.reference.classify(inputs), self.derived.classify(inputs))

    def classify_phases(self, inputs: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
        """The pair of the paired phase's rows; the derived class alone (pair (0, d)) of the others."""
        derived = self.derived.classify(inputs)
        out = torch.where(derived < self.classes, derived, self.classes ** 2)
        paired = torch.nonzero(phases == int(PAIRED)).flatten()
        if len(paired):
            out[paired] = self._pairs(self.reference.classify(inputs[paired]), derived[paired])
        return out

    def _pairs(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        finite = (first < self.classes) & (second < self.classes)
        return torch.where(finite, first * self.classes + second, self.classes ** 2)
