"""CERTIFY and PREDICT with exactly Cohen, Rosenfeld & Kolter's (2019) semantics.

The smoothed classifier g(x) = argmax_c P(f(x + sigma * eta) = c), eta ~ N(0, I). The decisions are pure functions
of class counts, shared by every machinery that produces counts.

* CERTIFY(x, n0, n, alpha): guess the top class cA from n0 noisy samples; count it in n FRESH samples (nA);
  pA_lower = one-sided Clopper-Pearson bound at level 1 - alpha; if pA_lower < 1/2 abstain, else certify cA within
  radius sigma * Phi^-1(pA_lower). With probability at least 1 - alpha, g(x) = cA and g is constant on that L2 ball.
* PREDICT(x, n, alpha): the top two classes of n samples; abstain unless the two-sided binomial test of count1 vs
  count1 + count2 at p = 1/2 has p-value <= alpha."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.stats.bounds import lower_confidence_bound, radius, top_two_pvalue

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
    return bound_certificate(guess, int(selection.sum()), int(estimation[guess]), int(estimation.sum()), alpha, sigma)


def bound_certificate(guess: int, n0: int, n_a: int, n: int, alpha: float, sigma: float) -> Certificate:
    """The certificate of n_a votes for ``guess`` in n samples by Clopper-Pearson at ``alpha`` (abstains below 1/2)."""
    p_a_lower = lower_confidence_bound(n_a, n, alpha)
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


def finite_counts(index: int, counts: np.ndarray) -> np.ndarray:
    """An image's class counts without the non-finite column; UserError if any sample's logits were NaN or infinite."""
    bad = int(counts[..., -1].sum())
    if bad:
        raise UserError(f"the classifier returned NaN or infinite logits for image {index} ({bad:,} of "
                        f"{int(counts.sum()):,} noisy samples): refusing to certify a non-finite classifier")
    finite: np.ndarray = counts[..., :-1].copy()
    return finite
