"""Monte-Carlo check of --sequential's continuous radius with the default ``grow`` (issue 58): the rate of
pA_lower > p over 100,000 simulated images of known p, at alpha 0.01 (where a breach is visible), caps 10,000
and 100,000, sigma 0.25 / 0.5 / 1.0, the command's default design (sequential_certifier, as dmae-certify builds
it). The p values sit just below the thresholds where a false certificate is likeliest: the lowest and the top
grid level, and the radius family's tests just above the top level (where ``grow`` keeps images drawing) and at
the middle of its reach. Library level (the certifier's own stop() and certify() on Bernoulli votes): the whole
command at 100,000 trials would need about 10^9 forward passes on this CPU.

    python bench/experiments/2026-12-06-sequential-growth/montecarlo.py > montecarlo.tsv
"""

from __future__ import annotations

import math
import sys

import numpy as np
from scipy.special import ndtr

from dmae_fast.stats.sequential_procedure import sequential_certifier

N0, ALPHA, TRIALS = 100, 0.01, 100_000


def false_rate(c, p: float, rng: np.random.Generator) -> tuple[float, float]:
    """(rate of pA_lower > p, mean estimation samples) over TRIALS images whose votes are Bernoulli(p)."""
    steps = np.diff((0, *c.looks))[:, None]
    votes = np.cumsum(rng.binomial(steps, p, size=(len(c.looks), TRIALS)), axis=0)
    stopped, n_a = c.run(votes)
    outcomes, index = np.unique(np.stack([stopped, n_a]), axis=1, return_inverse=True)
    bounds = np.array([c.certify(np.array([N0, 0]), int(a), c.looks[int(k)]).p_a_lower for k, a in outcomes.T])
    return float((bounds[index.reshape(-1)] > p).mean()), float(np.array(c.looks)[stopped].mean())


def cases(c) -> dict[str, float]:
    """Where to look: z = radius / sigma just below each chosen test's threshold."""
    above = c.radius_family.interval(c.target)[0]
    return {"lowest grid level": c.level_radii[0] / c.config.sigma,
            "top grid level": c.level_radii[c.target] / c.config.sigma,
            "first test above the top": float(above[0]), "middle above the top": float(above[above.size // 2])}


if __name__ == "__main__":
    limit = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / TRIALS)
    print("cap\tsigma\tcase\tz\tp\tfalse_rate\tlimit\tsamples_per_image", flush=True)
    for cap in (10_000, 100_000):
        for sigma in (0.25, 0.5, 1.0):
            c = sequential_certifier(N0, cap, ALPHA, sigma)
            rng = np.random.default_rng([cap, int(100 * sigma)])
            for case, z in cases(c).items():
                p = float(ndtr(z)) * (1 - 1e-12)
                rate, samples = false_rate(c, p, rng)
                print(f"{cap}\t{sigma}\t{case}\t{z:.4f}\t{p:.8f}\t{rate:.5f}\t{limit:.5f}\t{samples:.0f}", flush=True)
                print(cap, sigma, case, rate, file=sys.stderr, flush=True)
