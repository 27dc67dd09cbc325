"""The continuous radius of --sequential's exact test at its default designs, checked exactly (issue 58, step 1).

For each design (n0 100, caps 10,000 and 100,000, alpha 0.001 and 0.01, sigma 0.25 / 0.5 / 1.0, the command's
default radii, looks and futility), a DP over the failure counts with the design's own stopping rule gives the
probability of every outcome (stopping look, failures) at P(vote for cA) = p; each outcome's pA_lower comes from
the certifier. It reports, over 2,000+ values of p (spread over (0, 1), over z in [0, 4.2], and just below every
threshold of the radius family, each test's worst case): the largest P_p(pA_lower > p) (a false certificate),
with the DP's truncated mass counted as false; and the smallest radius minus grid radius over every outcome
reached (consistency: never negative).

    cd bench/experiments/2026-12-06-sequential-radius
    python coverage.py > ../../results/2026-12-06-sequential-radius/coverage.tsv
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np
from scipy.signal import fftconvolve
from scipy.special import ndtr
from scipy.stats import binom

from dmae_fast.stats.sequential_procedure import sequential_certifier

N0 = 100


def increment(m: int, q: float) -> tuple[int, np.ndarray, float]:
    """Failures among m new samples at failure probability q: first value, pmf window, mass outside it."""
    spread = 40 * math.sqrt(m * q * (1 - q)) + 40
    lo, hi = max(0, math.floor(m * q - spread)), min(m, math.ceil(m * q + spread))
    pmf = binom.pmf(np.arange(lo, hi + 1), m, q)
    return lo, pmf, float((binom.cdf(lo - 1, m, q) if lo > 0 else 0.0) + binom.sf(hi, m, q))


def outcome_probabilities(c, p: float) -> tuple[list[tuple[int, np.ndarray, np.ndarray]], float]:
    """(look, failures, probability) of the stops at each look, and the mass the DP left out."""
    alive, start, previous, lost, stops = np.ones(1), 0, 0, 0.0, []
    for k, look in enumerate(c.looks):
        lo, pmf, outside = increment(look - previous, 1 - p)
        alive, start, previous, lost = np.maximum(fftconvolve(alive, pmf), 0.0), start + lo, look, lost + outside
        failures = start + np.arange(alive.size)
        stop = c.stop(k, look - failures)
        stops.append((k, failures[stop], alive[stop]))
        alive = np.where(stop, 0.0, alive)
        live = np.flatnonzero(alive > 1e-300)
        if live.size == 0:
            break
        alive, start = alive[live[0]:live[-1] + 1], start + int(live[0])
    return stops, lost


def p_lower(c, k: int, failures: np.ndarray) -> np.ndarray:
    """pA_lower of each outcome (0 where it abstains), as the certifier's certify() gives it."""
    look = c.looks[k]
    out = np.zeros(failures.size)
    for i, f in enumerate(failures):
        out[i] = c.certify(np.array([N0, 0]), int(look - f), look).p_a_lower
    return out


def check(n: int, alpha: float, sigma: float) -> dict[str, object]:
    start = time.perf_counter()
    c = sequential_certifier(N0, n, alpha, sigma)
    family = np.concatenate([c.radius_family.z] + [c.radius_family.interval(j)[0] for j in range(c.target + 1)])
    built = time.perf_counter() - start
    just_below = ndtr(family[family > 0]) * (1 - 1e-12)
    p_grid = np.unique(np.concatenate([np.linspace(1e-3, 1 - 1e-3, 500), ndtr(np.linspace(0, 4.2, 1500)),
                                       just_below]))
    cache: dict[tuple[int, int], float] = {}
    worst, worst_p, lowest_gap = 0.0, 0.0, math.inf
    for p in p_grid:
        stops, lost = outcome_probabilities(c, float(p))
        false = lost
        for k, failures, probability in stops:
            keep = probability > 0
            failures, probability = failures[keep], probability[keep]
            missing = [f for f in failures.tolist() if (k, f) not in cache]
            if missing:
                bounds = p_lower(c, k, np.array(missing))
                grid = c.certified_radius(k, c.looks[k] - np.array(missing))
                for f, b, g in zip(missing, bounds, grid):
                    cache[k, f] = float(b)
                    if g >= 0:
                        radius = c.certify(np.array([N0, 0]), c.looks[k] - f, c.looks[k]).radius
                        lowest_gap = min(lowest_gap, radius - g)
            claimed = np.array([cache[k, f] for f in failures.tolist()])
            false += float(probability[claimed > p].sum())
        if false > worst:
            worst, worst_p = false, float(p)
    return {"cap": n, "alpha": alpha, "sigma": sigma, "family_tests": family.size, "p_values": p_grid.size,
            "worst_false": worst, "at_p": worst_p, "worst_over_alpha": worst / alpha,
            "min_radius_minus_grid": lowest_gap, "outcomes_reached": len(cache),
            "family_build_s": round(built, 1), "total_s": round(time.perf_counter() - start, 1)}


if __name__ == "__main__":
    columns = None
    for cap in (10_000, 100_000):
        for alpha in (0.001, 0.01):
            for sigma in (0.25, 0.5, 1.0):
                result = check(cap, alpha, sigma)
                if columns is None:
                    columns = list(result)
                    print("\t".join(columns), flush=True)
                print("\t".join(str(result[c]) for c in columns), flush=True)
                print(result, file=sys.stderr, flush=True)
