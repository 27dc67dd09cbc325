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


def measure_agreement(model: SmoothingClassifier, engine: Engine, data: str, images: int, samples_per_image: int,
                      sigma: float, seed: int | None = None) -> Agreement:
    """The engine against ``model`` (fp32, eager, on the engine's device) on the first ``images`` of ``data``, each
    with ``samples_per_image`` noisy copies at ``sigma`` (the noise contract's estimation draws under ``seed``,
    random by default). The bound holds for the images' average disagreement rate: the total is a sum of
    independent counts, one binomial per image, whose lower tail is no heavier than one binomial's of the same mean
    (Hoeffding, 1956), so the Clopper-Pearson bound of the total errs only high."""
    seed = secrets.randbits(63) if seed is None else seed
    dataset = open_dataset(data, image_size=model.spec.input_size)
    chosen = subset_indices(len(dataset), 1, images)
    paired = PairedEngine(TorchEngine(model, engine.device), engine)
    smoothing = Smoothing(paired, sigma, seed, BATCH)
    items = ((index, *dataset[index]) for index in chosen)
    plan = SamplingPlan((Phase.ESTIMATION,), (samples_per_image,))
    classes = model.spec.num_classes
    disagreements = 0
    for done in StreamingCertifier(smoothing, plan).run(items):
        table = done.counts[0].reshape(classes, classes)
        disagreements += int(table.sum() - np.trace(table))
    samples = len(chosen) * samples_per_image
    zeta_upper = float(disagreement_upper_bounds(disagreements, samples, ALPHA))
    return Agreement(data, len(chosen), samples_per_image, sigma, seed, disagreements, samples, zeta_upper, ALPHA)
