"""``dmae-export --check-agreement DATA``: how often an engine's class differs from the fp32 PyTorch model's on
DATA's images under the smoothing noise, with a certified upper bound on the average rate (the figure incremental
certification subtracts from pA_lower; docs/export.md)."""

from __future__ import annotations

import secrets

import numpy as np

from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import StreamingCertifier
from dmae_fast.data import open_dataset, subset_indices
from dmae_fast.engines.base import Engine
from dmae_fast.engines.paired import PairedEngine
from dmae_fast.engines.sidecar import Agreement
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.stats.incremental import disagreement_upper_bounds
from dmae_fast.stats.plan import Phase, SamplingPlan

ALPHA = 0.001  # the level of the bound recorded
BATCH = 256


class AgreementCheck:
    """The check's data, opened once before any export (a bad DATA costs no compile), and its settings."""

    def __init__(self, model: SmoothingClassifier, data: str, images: int, samples_per_image: int, sigma: float,
                 seed: int | None = None) -> None:
        self.model, self.data, self.samples_per_image, self.sigma = model, data, samples_per_image, sigma
        self.seed = secrets.randbits(63) if seed is None else seed
        self.dataset = open_dataset(data, image_size=model.spec.input_size)
        self.chosen = subset_indices(len(self.dataset), 1, images)

    def measure(self, engine: Engine) -> Agreement:
        """The engine against the model (fp32, eager, on the engine's device) on the chosen images, each with
        ``samples_per_image`` noisy copies at ``sigma`` (the noise contract's estimation draws under ``seed``). The
        bound holds for the images' average disagreement rate: the total is a sum of independent counts, one
        binomial per image, whose lower tail below its mean is no heavier than one binomial's of the same mean
        (Hoeffding, 1956), so the Clopper-Pearson bound of the total errs only high."""
        paired = PairedEngine(TorchEngine(self.model, engine.device), engine)
        smoothing = Smoothing(paired, self.sigma, self.seed, BATCH)
        items = ((index, *self.dataset[index]) for index in self.chosen)
        plan = SamplingPlan((Phase.ESTIMATION,), (self.samples_per_image,))
        classes = self.model.spec.num_classes
        disagreements = 0
        for done in StreamingCertifier(smoothing, plan).run(items):
            table = done.counts[0].reshape(classes, classes)
            disagreements += int(table.sum() - np.trace(table))
        samples = len(self.chosen) * self.samples_per_image
        zeta_upper = float(disagreement_upper_bounds(disagreements, samples, ALPHA))
        return Agreement(self.data, len(self.chosen), self.samples_per_image, self.sigma, self.seed, disagreements,
                         samples, zeta_upper, ALPHA)
