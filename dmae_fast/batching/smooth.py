"""The smoothed classifier g(x) = argmax_c P(f(x + sigma * eta) = c), eta ~ N(0, I), one image at a
time: :class:`Smooth` (Cohen et al.'s reference loop), and the device counts that every counting loop
keeps. The decisions from the counts are pure and live in :mod:`dmae_fast.stats.decisions`."""

from __future__ import annotations

import numpy as np
import torch

from dmae_fast.batching.job import zero_counts
from dmae_fast.engines.base import Engine
from dmae_fast.noise.contract import gaussian_noise
from dmae_fast.stats.decisions import Certificate, Prediction, certify_from_counts, finite_counts, predict_from_counts
from dmae_fast.stats.plan import Phase


class Smooth:
    """The smoothed classifier around ``engine``, one image at a time (the reference loop); its noise
    follows the noise contract, so its counts equal the streaming certifier's."""

    def __init__(self, engine: Engine, sigma: float, seed: int = 0, batch_size: int = 1000) -> None:
        self.engine, self.sigma, self.seed, self.batch_size = engine, sigma, seed, batch_size

    def sample_counts(self, image: torch.Tensor, index: int, phase: Phase, num: int) -> np.ndarray:
        """Class counts of ``num`` noisy copies of ``image`` (samples 0 .. num-1 of ``phase``)."""
        device = self.engine.device
        counts = zero_counts(1, 1, self.engine.spec.num_classes, device)[0, 0]
        image = image.to(device)
        for start in range(0, num, self.batch_size):
            samples = torch.arange(start, min(start + self.batch_size, num), device=device)
            images = torch.full_like(samples, index)
            noise = gaussian_noise(self.seed, images, int(phase), samples, tuple(image.shape))
            classes = self.engine.classify(image + self.sigma * noise)
            counts += torch.bincount(classes, minlength=counts.numel())
        return finite_counts(index, counts.cpu().numpy())

    def certify(self, image: torch.Tensor, index: int, n0: int, n: int, alpha: float) -> Certificate:
        selection = self.sample_counts(image, index, Phase.SELECTION, n0)
        estimation = self.sample_counts(image, index, Phase.ESTIMATION, n)
        return certify_from_counts(selection, estimation, alpha, self.sigma)

    def predict(self, image: torch.Tensor, index: int, n: int, alpha: float) -> Prediction:
        return predict_from_counts(self.sample_counts(image, index, Phase.PREDICTION, n), alpha)
