"""Samples saved by sequential CERTIFY on a simulated, ImageNet-shaped population.

Population: for each sigma, 1,000 images get a true probability pA that the base classifier votes for
the true class (two classes: the other class gets 1 - pA), chosen so that fixed-n CERTIFY
(n0 = 100, n = 10,000, alpha = 0.001) reproduces the DMAE ViT-B ImageNet certified
accuracies. Images certified in a radius bin [r_i, r_i+1) get certified radii spread evenly
over the bin, turned into pA by inverting the Clopper-Pearson bound at n; the images not
certified at radius 0 get pA spread evenly over [0.1, 0.5] (misclassified or abstaining).
The top bin (up to the cap sigma * 3.1986) has two scenarios: "spread" as the other bins,
"saturated" with pA = 1 (every top-bin image at the cap). Fixed-n and sequential CERTIFY
run on the same simulated votes (sequential reads a prefix of them).

    python -m dmae_fast.bench.sequential_savings [OUTPUT_PREFIX]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.stats import norm

from dmae_fast.stats.bounds import max_radius
from dmae_fast.stats.sequential import (
    SequentialCertifier,
    SequentialConfig,
    default_looks,
    lower_bounds,
)
from dmae_fast.stats.settings import FUTILITY_MODES, PAPER_RADII

N0, N_MAX, ALPHA, IMAGES = 100, 10_000, 0.001, 1_000
GRID = (0.0, *PAPER_RADII)
# DMAE ViT-B, ImageNet: certified accuracy (%) at GRID.
PAPER = {0.25: (78.1, 69.6, 0.0, 0.0, 0.0, 0.0),
         0.5: (73.0, 64.8, 57.9, 47.8, 0.0, 0.0),
         1.0: (58.0, 53.3, 47.1, 41.7, 35.4, 22.5)}
SCENARIOS = ("spread", "saturated")
# Schedules compared with the default (in the "spread" scenario).
CANDIDATE_LOOKS = {"default": default_looks(N_MAX),
                   "doubling to n_max, K=6": (313, 625, 1250, 2500, 5000, 10_000),
                   "ratio 1.5, K=8": (586, 878, 1317, 1976, 2963, 4445, 6667, 10_000),
                   "K=4": (723, 2167, 6500, 10_000)}
DEFAULT_PREFIX = "bench/results/2026-11-22-sequential-simulation"


def population(sigma: float, scenario: str) -> np.ndarray:
    """True pA of IMAGES images whose fixed-n certified accuracies match PAPER[sigma]."""
    counts = np.round(np.array(PAPER[sigma]) * IMAGES / 100).astype(int)
    in_bin = counts - np.append(counts[1:], 0)
    top = np.flatnonzero(in_bin)[-1]
    edges = np.append(GRID, max_radius(N_MAX, ALPHA, sigma))
    table = lower_bounds(np.arange(N_MAX + 1), N_MAX, ALPHA)
    parts = [0.1 + 0.4 * _even(IMAGES - counts[0])]
    for i, m in enumerate(in_bin):
        hi = edges[-1] if i == top else edges[i + 1]
        radii = edges[i] + (hi - edges[i]) * _even(m)
        p = np.searchsorted(table, norm.cdf(radii / sigma)) / N_MAX
        parts.append(np.ones(m) if i == top and scenario == "saturated" else p)
    return np.concatenate(parts)


def _even(m: int) -> np.ndarray:
    """m points spread evenly over (0, 1)."""
    return (np.arange(m) + 0.5) / max(m, 1)


@dataclass(frozen=True)
class Outcome:
    samples: float  # mean selection + estimation samples per image
    accuracy: tuple[float, ...]  # certified accuracy (%) at GRID


def simulate(sigma: float, scenario: str, looks: tuple[int, ...], reps: int, seed: int) -> dict[str, Outcome]:
    """Fixed-n and sequential CERTIFY (every futility mode) on reps copies of the population."""
    p = np.tile(population(sigma, scenario), reps)
    rng = np.random.default_rng(seed)
    correct_guess = 2 * rng.binomial(N0, p) >= N0  # argmax of the selection counts, ties to class 0
    q = np.where(correct_guess, p, 1 - p)
    counts = np.cumsum(rng.binomial(np.diff((0, *looks))[:, None], q), axis=0)
    thresholds = norm.cdf(np.array(GRID) / sigma)
    bound = lower_bounds(counts[-1], N_MAX, ALPHA)
    out = {"fixed-n": Outcome(N0 + N_MAX, _accuracy(bound, correct_guess, thresholds))}
    for mode in FUTILITY_MODES:
        config = SequentialConfig(N0, N_MAX, ALPHA, sigma, radii=PAPER_RADII, looks=looks, futility=mode)
        certifier = SequentialCertifier(config)
        stopped, n_a = certifier.run(counts)
        n_used = np.array(looks)[stopped]
        bound = lower_bounds(n_a, n_used, certifier.level)
        out[mode] = Outcome(N0 + float(n_used.mean()), _accuracy(bound, correct_guess, thresholds))
    return out


def _accuracy(bound: np.ndarray, correct_guess: np.ndarray, thresholds: np.ndarray) -> tuple[float, ...]:
    """Certified accuracy (%): the true class certified with pA_lower >= Phi(r / sigma)."""
    return tuple(float(100 * np.mean(correct_guess & (bound >= t))) for t in thresholds)


def _drop(fixed: Outcome, sequential: Outcome) -> float:
    """The largest loss of certified accuracy (points) over GRID."""
    return max(f - s for f, s in zip(fixed.accuracy, sequential.accuracy))


def table(results: dict[float, dict[str, Outcome]]) -> str:
    """Samples, savings and certified accuracy (change vs fixed-n) for one scenario."""
    head = " | ".join(f"r={r:g}" for r in GRID)
    lines = [f"| sigma | procedure | samples/image | fixed/seq | {head} | worst drop |",
             "|" + " --- |" * (5 + len(GRID))]
    for sigma, outcomes in results.items():
        fixed = outcomes["fixed-n"]
        lines.append(f"| {sigma} | paper (fixed-n) | | | " + " | ".join(f"{a:.1f}" for a in PAPER[sigma]) + " | |")
        for name, o in outcomes.items():
            cells = [f"{a:.1f}" if name == "fixed-n" else f"{a:.1f} ({a - f:+.1f})"
                     for a, f in zip(o.accuracy, fixed.accuracy)]
            label = name if name == "fixed-n" else f"sequential, futility {name}"
            lines.append(f"| {sigma} | {label} | {o.samples:,.0f} | {fixed.samples / o.samples:.2f}x | "
                         + " | ".join(cells) + f" | {_drop(fixed, o):.1f} |")
    return "\n".join(lines)


def comparison(results: dict[str, dict[float, dict[str, Outcome]]]) -> str:
    """Savings (fixed/seq) and worst accuracy drop for each candidate schedule."""
    sigmas = list(PAPER)
    lines = ["| looks | futility | " + " | ".join(f"sigma {s}: fixed/seq, worst drop" for s in sigmas) + " |",
             "|" + " --- |" * (2 + len(sigmas))]
    for name, by_sigma in results.items():
        for mode in FUTILITY_MODES:
            cells = [f"{o['fixed-n'].samples / o[mode].samples:.2f}x, {_drop(o['fixed-n'], o[mode]):.1f}"
                     for o in by_sigma.values()]
            lines.append(f"| {name} {CANDIDATE_LOOKS[name]} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, reps: int = 20, seed: int = 0) -> dict:
    """Simulate every scenario and candidate schedule, write PREFIX.{md,json}, print the tables."""
    argv = sys.argv[1:] if argv is None else argv
    prefix = argv[0] if argv else DEFAULT_PREFIX
    start = time.perf_counter()
    looks = CANDIDATE_LOOKS["default"]
    runs = {scenario: {s: simulate(s, scenario, looks, reps, seed) for s in PAPER} for scenario in SCENARIOS}
    candidates = {name: runs["spread"] if name == "default" else
                  {s: simulate(s, "spread", schedule, reps, seed) for s in PAPER}
                  for name, schedule in CANDIDATE_LOOKS.items()}
    seconds = time.perf_counter() - start
    sections = [f"n0 {N0}, n_max {N_MAX}, alpha {ALPHA}, {IMAGES} images x {reps} repetitions per sigma "
                f"(seed {seed}), default looks {looks}; {seconds:.1f} s."]
    sections += [f"## Top bin {scenario}\n\n{table(runs[scenario])}" for scenario in SCENARIOS]
    sections.append(f"## Looks schedules (top bin spread)\n\n{comparison(candidates)}")
    text = "\n\n".join(sections)
    record = {"n0": N0, "n_max": N_MAX, "alpha": ALPHA, "images": IMAGES, "reps": reps, "seed": seed,
              "radii": list(GRID), "paper": {str(s): a for s, a in PAPER.items()},
              "looks": {name: list(schedule) for name, schedule in CANDIDATE_LOOKS.items()},
              "scenarios": {scenario: _plain(by_sigma) for scenario, by_sigma in runs.items()},
              "schedules": {name: _plain(by_sigma) for name, by_sigma in candidates.items()},
              "seconds": round(seconds, 2)}
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    population_note = __doc__.split("\n\n")[1]
    Path(f"{prefix}.md").write_text(f"# Sequential CERTIFY on a simulated population\n\n{population_note}\n\n{text}\n")
    Path(f"{prefix}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(text)
    return record


def _plain(by_sigma: dict[float, dict[str, Outcome]]) -> dict:
    return {str(s): {name: asdict(o) for name, o in outcomes.items()} for s, outcomes in by_sigma.items()}


if __name__ == "__main__":
    main()
