"""CERTIFY and PREDICT with exactly Cohen, Rosenfeld & Kolter's (2019) semantics.

The smoothed classifier g(x) = argmax_c P(f(x + sigma * eta) = c), eta ~ N(0, I).

* CERTIFY(x, n0, n, alpha): guess the top class cA from n0 noisy samples; count it in n
  FRESH samples (nA); pA_lower = one-sided Clopper-Pearson bound at level 1 - alpha; if
  pA_lower < 1/2 abstain, else certify cA within radius sigma * Phi^-1(pA_lower). With
  probability at least 1 - alpha, g(x) = cA and g is constant on that L2 ball.
* PREDICT(x, n, alpha): the top two classes of n samples; abstain unless the two-sided
  binomial test of count1 vs count1 + count2 at p = 1/2 has p-value <= alpha.

The decisions (``certify_from_counts``, ``predict_from_counts``) are pure functions of
class counts, so any machinery that produces counts (the one-image-at-a-time
:class:`Smooth` below, or the batched :mod:`dmae_fast.certification.stream`) shares them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dmae_fast.certification.bounds import (
    lower_confidence_bound,
    radius,
    top_two_pvalue,
)
from dmae_fast.engines.base import Engine
from dmae_fast.errors import UserError
from dmae_fast.noise import Phase, gaussian_noise

ABSTAIN = -1
FIXED_N = "cohen-fixed-n"  # the `procedure` column of results made by this module


@dataclass(frozen=True)
class Certificate:
    prediction: int  # ABSTAIN or the certified class
    radius: float  # 0.0 when abstaining
    n0: int
    n: int
    n_a: int  # estimation samples of the selected class
    p_a_lower: float


@dataclass(frozen=True)
class Prediction:
    prediction: int  # ABSTAIN or the predicted class
    n: int
    count1: int
    count2: int
    pvalue: float


def certify_from_counts(selection: np.ndarray, estimation: np.ndarray, alpha: float, sigma: float) -> Certificate:
    """CERTIFY's decision from the class counts of its two independent draws."""
    guess = int(np.argmax(selection))
    n_a, n = int(estimation[guess]), int(estimation.sum())
    p_a_lower = lower_confidence_bound(n_a, n, alpha)
    n0 = int(selection.sum())
    if p_a_lower < 0.5:
        return Certificate(ABSTAIN, 0.0, n0, n, n_a, p_a_lower)
    return Certificate(guess, radius(p_a_lower, sigma), n0, n, n_a, p_a_lower)


def predict_from_counts(counts: np.ndarray, alpha: float) -> Prediction:
    """PREDICT's decision from the class counts of its n samples."""
    order = np.argsort(-counts, kind="stable")
    top = int(order[0])
    count1 = int(counts[top])
    count2 = int(counts[order[1]]) if len(counts) > 1 else 0
    pvalue = top_two_pvalue(count1, count2)
    return Prediction(top if pvalue <= alpha else ABSTAIN, int(counts.sum()), count1, count2, pvalue)


def zero_counts(num_slots: int, num_phases: int, num_classes: int, device: torch.device) -> torch.Tensor:
    """Counts [slots, phases, num_classes + 1]: the last column counts samples whose logits
    were not finite (engines classify them as ``num_classes``)."""
    return torch.zeros((num_slots, num_phases, num_classes + 1), dtype=torch.int64, device=device)


def finite_counts(index: int, counts: np.ndarray) -> np.ndarray:
    """An image's class counts [..., num_classes] without the non-finite column, or a
    UserError if any sample's logits were NaN or infinite: nothing is certified for it."""
    bad = int(counts[..., -1].sum())
    if bad:
        raise UserError(f"the classifier returned NaN or infinite logits for image {index} ({bad:,} of "
                        f"{int(counts.sum()):,} noisy samples): refusing to certify a non-finite classifier")
    return counts[..., :-1].copy()


class Smooth:
    """The smoothed classifier around ``engine``, one image at a time (the reference loop).

    Noise follows the noise contract, so its counts equal the streaming certifier's.
    """

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
