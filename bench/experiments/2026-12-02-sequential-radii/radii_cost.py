"""What --sequential's default radii of interest cost: the paper's (0.5, 1, 1.5, 2, 3), the summary table's 0.25
steps up to the largest radius the cap certifies, and today's default (0.25 steps up to what min(cap, 10,000)
certifies, levels below the top one to 10,000: sequential_certifier without radii), on the simulated population of
dmae_fast.bench.sequential_savings (1,000 images per sigma and scenario, x reps), same votes for every procedure.

    python bench/experiments/2026-12-02-sequential-radii/radii_cost.py [REPS] > out.md
"""

from __future__ import annotations

import sys

import numpy as np
from scipy.stats import norm

from dmae_fast.bench.sequential_savings import ALPHA, N0, SCENARIOS, population
from dmae_fast.stats.bounds import lower_confidence_bound, max_radius
from dmae_fast.stats.group_sequential import GroupSequentialCertifier, GroupSequentialConfig
from dmae_fast.stats.sequential_procedure import sequential_certifier
from dmae_fast.stats.settings import PAPER_RADII

SUMMARY = tuple(0.25 * i for i in range(16))  # the table's radii, 0 .. 3.75


def quarter_steps(n: int, sigma: float) -> tuple[float, ...]:
    top = max_radius(n, ALPHA, sigma)
    return tuple(0.25 * i for i in range(1, max(1, int(top / 0.25 + 1e-9)) + 1))


def run(sigma: float, scenario: str, reps: int, seed: int = 0) -> list[tuple[str, int, float, list[float]]]:
    p = np.tile(population(sigma, scenario), reps)
    rng = np.random.default_rng(seed)
    correct = 2 * rng.binomial(N0, p) >= N0
    q = np.where(correct, p, 1 - p)
    certifiers = {(name, cap): GroupSequentialCertifier(GroupSequentialConfig(N0, cap, ALPHA, sigma, radii=radii))
                  for cap in (10_000, 100_000)
                  for name, radii in (("paper radii", PAPER_RADII),
                                      ("0.25 steps to the cap", quarter_steps(cap, sigma)))}
    certifiers |= {("default", cap): sequential_certifier(N0, cap, ALPHA, sigma) for cap in (10_000, 100_000)}
    looks = sorted({look for c in certifiers.values() for look in c.looks} | {10_000, 100_000})
    counts = np.cumsum(rng.binomial(np.diff((0, *looks))[:, None], q), axis=0)
    row = {look: k for k, look in enumerate(looks)}
    rows = []
    for cap in (10_000, 100_000):
        n_a = counts[row[cap]]
        bound = np.array([lower_confidence_bound(int(a), cap, ALPHA) for a in n_a])
        radius = np.where(bound >= 0.5, sigma * norm.ppf(np.maximum(bound, 0.5)), -1.0)
        rows.append((f"fixed-n {cap:,}", cap, N0 + cap, _accuracy(correct, radius)))
        for name in ("paper radii", "0.25 steps to the cap", "default"):
            c = certifiers[name, cap]
            stopped, at = c.run(np.stack([counts[row[look]] for look in c.looks]))
            certified = np.full(len(p), -1.0)
            for k in np.unique(stopped):
                certified[stopped == k] = c.certified_radius(k, at[stopped == k])
            used = N0 + float(np.array(c.looks)[stopped].mean())
            rows.append((f"exact sequential, {name}", cap, used, _accuracy(correct, certified)))
    return rows


def _accuracy(correct: np.ndarray, radius: np.ndarray) -> list[float]:
    return [float(100 * np.mean(correct & (radius >= r))) for r in SUMMARY]


def main(reps: int) -> None:
    head = " | ".join(f"{r:g}" for r in SUMMARY)
    print(f"n0 {N0}, alpha {ALPHA}, 1,000 images x {reps} per sigma and scenario; certified accuracy (%) at r =\n")
    print(f"| sigma | scenario | procedure | cap | samples/image | fixed-n at cap / this | {head} |")
    print("|" + " --- |" * (6 + len(SUMMARY)))
    for sigma in (0.25, 0.5, 1.0):
        for scenario in SCENARIOS:
            rows = run(sigma, scenario, reps)
            fixed = {cap: used for name, cap, used, _ in rows if name.startswith("fixed")}
            for name, cap, used, accuracy in rows:
                cells = " | ".join(f"{a:.1f}" for a in accuracy)
                print(f"| {sigma} | {scenario} | {name} | {cap:,} | {used:,.0f} | {fixed[cap] / used:.2f}x | {cells} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
