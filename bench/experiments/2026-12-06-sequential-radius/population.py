"""ACR of --sequential's radii on the simulated ImageNet-shaped population (issue 58, step 1).

The population of dmae_fast.bench.sequential_savings (1,000 images whose fixed-n certified accuracies match the
paper's, scenarios "spread" and "saturated"), votes drawn once per image and repetition and shared by every
procedure, the selection assumed right where pA > 1/2. For the exact test at its default design (n0 100,
alpha 0.001, caps 10,000 and 100,000): ACR of the grid radius (before), of the continuous radius (now), of the
Clopper-Pearson radius at the stopping counts (not valid after early stopping: the price of the design), of
fixed-n at the cap on the same votes, and the mean estimation samples per image.

    cd bench/experiments/2026-12-06-sequential-radius
    python population.py > ../../results/2026-12-06-sequential-radius/population.tsv
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from dmae_fast.bench.sequential_savings import SCENARIOS, population
from dmae_fast.stats.bounds import lower_confidence_bound
from dmae_fast.stats.sequential_procedure import sequential_certifier

N0, ALPHA, REPS = 100, 0.001, 3


def cp_radius(n_a: int, n: int, sigma: float) -> float:
    bound = lower_confidence_bound(n_a, n, ALPHA) if n_a > 0 else 0.0
    return sigma * float(ndtri(bound)) if bound >= 0.5 else 0.0


def measure(sigma: float, scenario: str, cap: int) -> dict[str, float]:
    c = sequential_certifier(N0, cap, ALPHA, sigma)
    p = population(sigma, scenario)
    rng = np.random.default_rng([int(100 * sigma), cap, SCENARIOS.index(scenario)])
    sums = {"grid": 0.0, "continuous": 0.0, "cp_at_stop": 0.0, "fixed_n": 0.0, "samples": 0.0}
    for _ in range(REPS):
        steps = np.diff((0, *c.looks))
        votes = np.cumsum(rng.binomial(steps[:, None], p[None, :]), axis=0)  # [looks, images]
        stopped, n_a = c.run(votes)
        for i in np.flatnonzero(p > 0.5):
            k, look, a = int(stopped[i]), c.looks[int(stopped[i])], int(n_a[i])
            sums["grid"] += max(float(c.certified_radius(k, np.array([a]))[0]), 0.0)
            sums["continuous"] += c.certify(np.array([N0, 0]), a, look).radius
            sums["cp_at_stop"] += cp_radius(a, look, sigma)
            sums["fixed_n"] += cp_radius(int(votes[-1, i]), cap, sigma)
        sums["samples"] += float(np.sum(np.array(c.looks)[stopped]))
    images = REPS * p.size
    acr = {name: value / images for name, value in sums.items()}
    return {"sigma": sigma, "scenario": scenario, "cap": cap, "samples_per_image": round(acr["samples"]),
            **{f"acr_{name}": round(acr[name], 4) for name in ("grid", "continuous", "cp_at_stop", "fixed_n")},
            "continuous_over_cp_at_stop": round(acr["continuous"] / acr["cp_at_stop"], 4),
            "continuous_over_fixed_n": round(acr["continuous"] / acr["fixed_n"], 4),
            "grid_over_fixed_n": round(acr["grid"] / acr["fixed_n"], 4)}


if __name__ == "__main__":
    header = False
    for cap in (10_000, 100_000):
        for sigma in (0.25, 0.5, 1.0):
            for scenario in SCENARIOS:
                row = measure(sigma, scenario, cap)
                if not header:
                    print("\t".join(row), flush=True)
                    header = True
                print("\t".join(str(v) for v in row.values()), flush=True)
