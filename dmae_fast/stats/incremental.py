"""Incremental certification (Ugare et al., ICLR 2024): certify a derived classifier f' (an fp16, fp8 or int8 engine
of f) from the certificate of f and n_p paired samples, instead of from scratch.

For the class cA that CERTIFY on f chose, with pA_lower a (1 - alpha) lower bound on P(f(x + e) = cA):

    P(f'(x + e) = cA) >= P(f(x + e) = cA) - P(f(x + e) = cA, f'(x + e) != cA) >= pA_lower - zeta_upper,

where zeta_upper is the one-sided Clopper-Pearson (1 - alpha_zeta) upper bound on zeta = P(f = cA, f' != cA), from
the disagreements among n_p paired samples: the same noisy inputs, f's vote (whether it chose cA) against f''s class.
So f' is certified at sigma * Phi^-1(pA_lower - zeta_upper) where that bound is at least 1/2, and the certificate
fails with probability at most alpha + alpha_zeta (a union bound: the two bounds may use the same noise, e.g. the
first n_p of f's own estimation samples, since each holds for independent draws whatever the other does). Where f
abstained, f' abstains: abstaining is always sound and costs no sample."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dmae_fast.stats.bounds import lower_confidence_bounds, radius
from dmae_fast.stats.decisions import ABSTAIN, Certificate


@dataclass(frozen=True)
class IncrementalCertificate(Certificate):
    """The derived classifier's certificate: the reference's class, or ABSTAIN. As a :class:`Certificate`: ``n0`` is
    0 (no selection draw), ``n`` the paired samples, ``n_a`` those without a disagreement, ``p_a_lower`` the derived
    classifier's bound (the reference's pA_lower - zeta_upper, floored at 0)."""

    disagreements: int = 0  # of the paired samples, f voted cA and f' did not
    zeta_upper: float = 1.0  # the (1 - alpha_zeta) upper bound on P(f = cA, f' != cA); 1.0 with no paired sample
    reference_p_a_lower: float = 0.0  # the reference's own bound
    alpha: float = 0.0  # the total failure probability: the reference's alpha + alpha_zeta


def disagreement_upper_bounds(disagreements: np.ndarray | int, n_p: np.ndarray | int, alpha_zeta: float) -> np.ndarray:
    """One-sided (1 - alpha_zeta) Clopper-Pearson upper bounds on a rate from ``disagreements`` of ``n_p`` (arrays
    broadcast): 1 - the lower bound on the agreement rate, moved up one double so that its rounding errs high."""
    d, n = np.asarray(disagreements), np.asarray(n_p)
    agreements = n - d
    lower = np.where(agreements > 0, lower_confidence_bounds(np.maximum(agreements, 1), np.maximum(n, 1), alpha_zeta),
                     0.0)
    upper: np.ndarray = np.minimum(np.nextafter(1.0 - lower, 2.0), 1.0)
    return np.where(n > 0, upper, 1.0)


def derived_lower_bounds(p_a_lower: np.ndarray | float, zeta_upper: np.ndarray | float) -> np.ndarray:
    """pA_lower - zeta_upper, moved down one double so that its rounding errs low, and floored at 0."""
    bound: np.ndarray = np.maximum(np.nextafter(np.asarray(p_a_lower) - np.asarray(zeta_upper), -1.0), 0.0)
    return bound


def disagreements(pairs: np.ndarray, classes: int, c_a: int) -> int:
    """Of paired samples counted by class pair (``pairs[r * classes + d]``: the reference chose r, the derived
    engine d; :class:`~dmae_fast.engines.paired.PairedEngine`), how many the reference voted ``c_a`` and the
    derived engine did not."""
    table = np.asarray(pairs).reshape(classes, classes)
    return int(table[c_a].sum() - table[c_a, c_a])


def incremental_certificate(reference: Certificate, disagreements: int, n_p: int, alpha: float, alpha_zeta: float,
                            sigma: float, choices: int = 1) -> IncrementalCertificate:
    """The derived classifier's certificate from the reference's (made at ``alpha``) and ``disagreements`` of
    ``n_p`` paired samples; it holds with probability >= 1 - alpha - alpha_zeta. ``choices``: how many sample sizes
    n_p was chosen from by the reference's counts (which share the paired samples' noise): each size's bound is made
    at alpha_zeta / choices, so that all of them hold at once with probability >= 1 - alpha_zeta."""
    if not 0 <= disagreements <= n_p:
        raise ValueError(f"disagreements must lie in [0, n_p = {n_p}], got {disagreements}")
    total = alpha + alpha_zeta
    agree = n_p - disagreements
    if reference.prediction == ABSTAIN:
        return IncrementalCertificate(ABSTAIN, 0.0, 0, n_p, agree, 0.0, disagreements, 1.0, reference.p_a_lower, total)
    zeta_upper = float(disagreement_upper_bounds(disagreements, n_p, alpha_zeta / choices))
    p_a_lower = float(derived_lower_bounds(reference.p_a_lower, zeta_upper))
    prediction, radius_ = (ABSTAIN, 0.0) if p_a_lower < 0.5 else (reference.prediction, radius(p_a_lower, sigma))
    return IncrementalCertificate(prediction, radius_, 0, n_p, agree, p_a_lower, disagreements, zeta_upper,
                                  reference.p_a_lower, total)
