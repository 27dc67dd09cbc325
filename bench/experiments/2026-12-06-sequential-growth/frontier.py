"""The frontier of --sequential's stopping rule at the 100,000 cap (issue 58, item 2): samples against ACR and the
worst certified-accuracy drop, for the exact test with ``grow`` (keep drawing while the radius is expected to grow
by more than ``grow`` in z per 10,000 further samples) swept, with and without the 10,000 lower cap.

Population: dmae_fast.bench.sequential_savings's 1,000 ImageNet-shaped images (scenarios "spread" and
"saturated"), votes drawn once per image and repetition and shared by every design and by fixed-n at the cap; the
selection assumed right where pA > 1/2 (as population.py in 2026-12-06-sequential-radius). Radii: the certifier's
continuous radius; fixed-n: Clopper-Pearson at the cap on the same votes. Certified accuracy at every 0.25 step.

    python bench/experiments/2026-12-06-sequential-growth/frontier.py [CAP] > frontier.tsv
"""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np
from scipy.special import ndtri

from dmae_fast.bench.sequential_savings import SCENARIOS, population
from dmae_fast.stats.group_sequential import GroupSequentialCertifier, GroupSequentialConfig
from dmae_fast.stats.radii import RADIUS_STEP, default_radii
from dmae_fast.stats.sequential import lower_bounds

N0, ALPHA, REPS = 100, 0.001, 3
GROW = (math.inf, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.0)


def radii_of(bounds: np.ndarray, sigma: float) -> np.ndarray:
    """Cohen et al.'s radius of pA_lower bounds, -1 where below 1/2 (abstain)."""
    return np.where(bounds >= 0.5, sigma * ndtri(np.maximum(bounds, 0.5)), -1.0)


def accuracy(radius: np.ndarray, steps: np.ndarray) -> np.ndarray:
    return 100 * (radius[None, :] >= steps[:, None]).mean(axis=1)


def oracle(p: np.ndarray, looks: tuple[int, ...], sigma: float, budget: float) -> tuple[float, float]:
    """(ACR, mean samples) of an oracle that knows each image's pA and spends at most ``budget`` samples per image on
    average: fixed-n Clopper-Pearson at the look that maximizes z - lam * samples with the expected votes (valid: the
    look depends on pA only), lam bisected to the budget. Images with pA <= 1/2 cost nothing."""
    m = np.array(looks, dtype=np.int64)[:, None]
    z = ndtri(np.maximum(lower_bounds(np.floor(p[None, :] * m).astype(np.int64), m, ALPHA), 0.5))
    lo, hi = 0.0, 1.0
    for _ in range(60):
        lam = (lo + hi) / 2
        pick = np.argmax(z - lam * m, axis=0)
        samples = np.where(p > 0.5, m[pick, 0], 0).mean()
        lo, hi = (lo, lam) if samples <= budget else (lam, hi)
    pick = np.argmax(z - hi * m, axis=0)
    radius = np.where(p > 0.5, sigma * z[pick, np.arange(p.size)], 0.0)
    return float(radius.mean()), float(np.where(p > 0.5, m[pick, 0], 0).mean())


def run(sigma: float, scenario: str, cap: int) -> list[dict[str, object]]:
    p = np.tile(population(sigma, scenario), REPS)
    p = np.where(p > 0.5, p, 0.0)  # wrong or abstaining images: never certified (as population.py)
    base = GroupSequentialConfig(N0, cap, ALPHA, sigma)
    looks = base.resolved_looks()
    rng = np.random.default_rng([int(100 * sigma), cap, SCENARIOS.index(scenario)])
    votes = np.cumsum(rng.binomial(np.diff((0, *looks))[:, None], p[None, :]), axis=0)  # [looks, images]
    fixed = radii_of(lower_bounds(votes[-1], cap, ALPHA), sigma)
    top = max(float(fixed.max()), 0.0)
    steps = RADIUS_STEP * np.arange(int(top / RADIUS_STEP) + 1)
    fixed_accuracy = accuracy(fixed, steps)
    rows = []
    designs = {"lower cap 10000": base,
               "no lower cap": dataclasses.replace(base, radii=default_radii(cap, ALPHA, sigma), looks=looks)}
    for design, config in designs.items():
        family = None
        for grow in GROW:
            c = GroupSequentialCertifier(dataclasses.replace(config, grow=grow))
            if family is not None:  # grow changes the stops only: one family (lazily built tables) per design
                c.radius_family = family
            family = c.radius_family
            stopped, n_a = c.run(votes)
            radius = np.array([c.certify(np.array([N0, 0]), int(a), c.looks[int(k)]).radius if q > 0 else -1.0
                               for k, a, q in zip(stopped, n_a, p)])
            cert = np.array([c.levels(int(k), int(a)) > 0 for k, a in zip(stopped, n_a)]) & (p > 0)
            radius = np.where(cert, radius, -1.0)
            drop = fixed_accuracy - accuracy(radius, steps)
            samples = float(np.array(c.looks)[stopped].mean())
            rows.append({"sigma": sigma, "scenario": scenario, "cap": cap, "design": design,
                         "grow": "off" if math.isinf(grow) else grow, "samples_per_image": round(samples),
                         "fewer_samples": round((N0 + cap) / (N0 + samples), 2),
                         "acr": round(float(np.maximum(radius, 0).mean()), 4),
                         "acr_fixed_n": round(float(np.maximum(fixed, 0).mean()), 4),
                         "acr_ratio": round(float(np.maximum(radius, 0).mean() / np.maximum(fixed, 0).mean()), 4),
                         "worst_drop_points": round(float(drop.max()), 2),
                         "at_radius": float(steps[int(drop.argmax())])})
            print(rows[-1], file=sys.stderr, flush=True)
    acr, samples = oracle(p, looks, sigma, cap / 10)
    fixed_acr = float(np.maximum(fixed, 0).mean())
    rows.append({**{k: rows[-1][k] for k in ("sigma", "scenario", "cap")}, "design": "oracle, 1/10 of the samples",
                 "grow": "-", "samples_per_image": round(samples),
                 "fewer_samples": round((N0 + cap) / (N0 + samples), 2),
                 "acr": round(acr, 4), "acr_fixed_n": round(fixed_acr, 4), "acr_ratio": round(acr / fixed_acr, 4),
                 "worst_drop_points": "-", "at_radius": "-"})
    print(rows[-1], file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    cap = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    header = False
    for sigma in (0.25, 0.5, 1.0):
        for scenario in SCENARIOS:
            for row in run(sigma, scenario, cap):
                if not header:
                    print("\t".join(row), flush=True)
                    header = True
                print("\t".join(str(v) for v in row.values()), flush=True)
