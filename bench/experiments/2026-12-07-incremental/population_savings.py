"""What incremental certification saves on the bench's simulated ImageNet-shaped population (issue 59, evidence 2,
by simulation): a derived engine that disagrees with the reference on a fraction d of noisy inputs, certified from
scratch against incrementally from the reference's run, under a rule that decides per image.

Population: ``dmae_fast.bench.sequential_savings.population`` (true pA per image, fitted to DMAE ViT-B's ImageNet
certified accuracies at sigma 0.25, 0.5 and 1.0). Two classes; the derived engine swaps the reference's class on a
fraction d of noisy inputs, independently, so P(f = cA, f' != cA) = d pA and P(f' = cA) = pA (1 - d) + (1 - pA) d.
CERTIFY: n0 = 100 selection samples, n estimation samples (the cap), alpha = 0.001; incremental rows hold at
alpha + alpha_zeta = 0.002. The paired samples are the first n_p of the reference's estimation samples (simulated
jointly with its count). Rules:

* ``threshold T``: from scratch where the reference's pA_lower > T, paired elsewhere;
* ``level``: paired only where the incremental radius with no disagreement keeps the reference's 0.25 level (so the
  certified accuracy at every step is kept unless disagreements appear), from scratch elsewhere.

Where the reference abstained the derived engine abstains (free). Cost: the derived engine's forward passes per
image (a paired sample is one pass with kept votes, two when the reference's vote is drawn again).

    python bench/experiments/2026-12-07-incremental/population_savings.py \
        > bench/results/2026-12-07-incremental/population-savings.txt
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from scipy.special import ndtri

from dmae_fast.bench.sequential_savings import population
from dmae_fast.stats.bounds import lower_confidence_bounds
from dmae_fast.stats.incremental import derived_lower_bounds, disagreement_upper_bounds

N0, ALPHA, ALPHA_ZETA, STEP = 100, 0.001, 0.001, 0.25
SIGMAS, CAPS, REPS, SEED = (0.25, 0.5, 1.0), (10_000, 100_000), 20, 59


def cp_lower(n_a: np.ndarray, n: int) -> np.ndarray:
    return np.where(n_a > 0, lower_confidence_bounds(np.maximum(n_a, 1), n, ALPHA), 0.0)


def certify(p_true: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fixed-n CERTIFY on two classes: (correct class chosen, pA_lower, P(vote = chosen class))."""
    chosen_true = rng.binomial(N0, p_true) * 2 >= N0
    p_chosen = np.where(chosen_true, p_true, 1 - p_true)
    return chosen_true, cp_lower(rng.binomial(n, p_chosen), n), p_chosen


def radii(p_lower: np.ndarray, sigma: float) -> np.ndarray:
    return np.where(p_lower >= 0.5, sigma * ndtri(np.clip(p_lower, 0.5, 1.0)), -1.0)  # -1: abstain


def summary(correct: np.ndarray, radius: np.ndarray, sigma: float) -> tuple[list[float], float]:
    """Certified accuracy (%) at 0, 0.25, ... up to 3 sigma, and ACR."""
    steps = np.arange(0, 3 * sigma + 1e-9, STEP)
    good = correct & (radius >= 0)
    return [100 * float(np.mean(good & (radius >= r))) for r in steps], float(np.mean(np.where(good, radius, 0.0)))


class Setting(NamedTuple):
    """One simulated setting: the reference's CERTIFY rows and the derived engine's from scratch."""

    d: float  # the derived engine's disagreement rate on noisy inputs
    sigma: float
    n: int  # the cap
    ref_true: np.ndarray  # the reference chose the correct class
    ref_lower: np.ndarray  # its pA_lower
    p_chosen: np.ndarray  # P(vote = its chosen class)
    scratch_true: np.ndarray  # the derived engine from scratch: correct class chosen
    scratch_lower: np.ndarray  # its pA_lower
    scratch_acc: list[float]  # its certified accuracy (%) at each step
    scratch_acr: float


def settings(rng: np.random.Generator) -> Iterator[Setting]:
    """Every (d, sigma, cap) of the population, simulated in this order (the next draws of ``rng`` are the
    caller's between settings)."""
    for d in (0.005, 0.001):
        for sigma in SIGMAS:
            p = np.tile(population(sigma, "spread"), REPS)
            for n in CAPS:
                ref_true, ref_lower, p_chosen = certify(p, n, rng)
                scratch_true, scratch_lower, _ = certify(p * (1 - d) + (1 - p) * d, n, rng)
                acc, acr = summary(scratch_true, radii(scratch_lower, sigma), sigma)
                yield Setting(d, sigma, n, ref_true, ref_lower, p_chosen, scratch_true, scratch_lower, acc, acr)


def main() -> None:
    rng = np.random.default_rng(SEED)
    print(f"simulated population x {REPS}; n0 {N0}, alpha {ALPHA}, alpha_zeta {ALPHA_ZETA}; forward passes of the "
          "derived engine per image (votes kept / votes drawn again); accuracy at 0, 0.25, ... up to 3 sigma")
    for d, sigma, n, ref_true, ref_lower, p_chosen, scratch_true, scratch_lower, scratch_acc, scratch_acr in (
            settings(rng)):
        ref_radius = radii(ref_lower, sigma)
        print(f"\nd {d}, sigma {sigma}, n {n:,}: from scratch {n + N0:,} passes, accuracy "
              f"{np.round(scratch_acc, 1).tolist()}, ACR {scratch_acr:.4f}")
        for n_p in (1_000, 5_000) if n == 10_000 else (1_000, 5_000, 20_000):
            # the first n_p estimation samples of the reference, paired: disagreements among them
            disagree = rng.binomial(n_p, d * p_chosen)
            zeta = disagreement_upper_bounds(disagree, n_p, ALPHA_ZETA)
            incremental = radii(derived_lower_bounds(ref_lower, zeta), sigma)
            best = radii(derived_lower_bounds(ref_lower, disagreement_upper_bounds(0, n_p, ALPHA_ZETA)), sigma)
            keeps_level = np.floor(best / STEP) == np.floor(ref_radius / STEP)
            rules = {"threshold 0.99": ref_lower <= 0.99, "threshold 0.999": ref_lower <= 0.999,
                     "level": keeps_level, "all paired": np.ones_like(keeps_level)}
            for name, paired in rules.items():
                free = ref_radius < 0
                scratch = ~paired & ~free
                radius = np.where(free, -1.0, np.where(paired, incremental,
                                                        radii(scratch_lower, sigma)))
                correct = np.where(paired | free, ref_true, scratch_true)
                acc, acr = summary(correct, radius, sigma)
                kept = (scratch * (n + N0) + paired * ~free * n_p).mean()
                redrawn = (scratch * (n + N0) + paired * ~free * 2 * n_p).mean()
                worst = max(abs(a - b) for a, b in zip(acc, scratch_acc))
                print(f"  n_p {n_p:6,} {name:16s}: passes {kept / (n + N0):.2f} / {redrawn / (n + N0):.2f} "
                      f"of from scratch; accuracy within {worst:.1f} points; ACR {acr / scratch_acr:.3f}x; "
                      f"paired {np.mean(paired & ~free):.0%}, from scratch {np.mean(scratch):.0%}")


if __name__ == "__main__":
    main()
