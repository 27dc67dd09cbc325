"""Samples saved by group-sequential CERTIFY (issue 27) on sequential_savings' simulated population.

For each sigma and top-bin scenario of :mod:`dmae_fast.bench.sequential_savings` (1,000 images
whose fixed-n CERTIFY at n = 10,000 reproduces the DMAE ViT-B ImageNet certified accuracies), every
procedure reads prefixes of the same simulated votes: fixed-n CERTIFY at 10,000 and 100,000, today's
sequential CERTIFY (Clopper-Pearson at alpha / K, cap 10,000, futility "upper"), and
:class:`~dmae_fast.stats.group_sequential.GroupSequentialCertifier` with caps 10,000,
30,000 and 100,000 (and 100,000 for the top radius only, 10,000 below it), plus the tuning
variants. Samples per image count selection (n0 = 100) and estimation samples; certified accuracy
at radius r is the share of images whose true class is certified at r or more.

    python -m dmae_fast.bench.group_sequential_savings [OUTPUT_DIR]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from scipy.stats import norm

from dmae_fast.bench.sequential_savings import (
    ALPHA,
    GRID,
    IMAGES,
    N0,
    PAPER,
    SCENARIOS,
    population,
)
from dmae_fast.stats.boundary_dp import boundary_table
from dmae_fast.stats.group_sequential import GroupSequentialCertifier, GroupSequentialConfig
from dmae_fast.stats.sequential import (
    SequentialCertifier,
    SequentialConfig,
    lower_bounds,
)
from dmae_fast.stats.settings import PAPER_RADII

DEFAULT_DIR = "bench/results/2026-11-26-sequential-v2"
FIXED_10K, FIXED_100K, TODAY = "fixed-n 10,000", "fixed-n 100,000", "sequential CP/K (today), cap 10,000"
GS = "group-sequential, cap {:,}"
LOW_CAP = "group-sequential, cap 100,000 for the top radius, 10,000 below"
# Issue 27's targets: samples ratio fixed-n 10,000 / cap 10,000 at each sigma.
TARGET_RATIO_10K = {0.25: 7.5, 0.5: 2.2, 1.0: 2.5}
TARGET_DROP_10K, TARGET_DROP_100K, TARGET_RATIO_100K = 0.3, 0.2, 10.0
# Tuning variants (changes to the default configuration), run at caps 10,000 and 100,000.
VARIANTS = {"rho 3 at every level": {"spending": (3.0,)}, "final_shift 0.005": {"final_shift": 0.005},
            "final_shift 0.02": {"final_shift": 0.02}, "futility_alpha 0.05": {"futility_alpha": 0.05},
            "futility deterministic": {"futility": "deterministic"}}

Run = Callable[[Callable[[int], np.ndarray], np.ndarray], tuple[np.ndarray, np.ndarray]]
"""(votes for cA among the first L samples of every image, thresholds Phi(GRID / sigma)) ->
(estimation samples used per image, certified[radius, image])."""


@dataclass(frozen=True)
class Outcome:
    samples: float  # mean selection + estimation samples per image
    accuracy: tuple[float, ...]  # certified accuracy (%) at GRID


def fixed(n: int) -> tuple[tuple[int, ...], Run]:
    def run(votes, thresholds):
        bound = lower_bounds(votes(n), n, ALPHA)
        return np.full(bound.shape, n), bound >= thresholds[:, None]
    return (n,), run


def today(sigma: float) -> tuple[tuple[int, ...], Run]:
    c = SequentialCertifier(SequentialConfig(N0, 10_000, ALPHA, sigma, radii=PAPER_RADII, futility="upper"))

    def run(votes, thresholds):
        stopped, n_a = c.run(np.stack([votes(look) for look in c.looks]))
        used = np.array(c.looks)[stopped]
        return used, lower_bounds(n_a, used, c.level) >= thresholds[:, None]
    return c.looks, run


def group(config: GroupSequentialConfig) -> tuple[tuple[int, ...], Run]:
    c = GroupSequentialCertifier(config)

    def run(votes, thresholds):
        stopped, n_a = c.run(np.stack([votes(look) for look in c.looks]))
        radius = np.empty(n_a.shape)
        for k in np.unique(stopped):
            radius[stopped == k] = c.certified_radius(k, n_a[stopped == k])
        return np.array(c.looks)[stopped], radius >= np.array(GRID)[:, None]
    return c.looks, run


def procedures(sigma: float) -> dict[str, tuple[tuple[int, ...], Run]]:
    """Every procedure compared at sigma, by name."""
    base = {n: GroupSequentialConfig(N0, n, ALPHA, sigma, radii=PAPER_RADII) for n in (10_000, 30_000, 100_000)}
    out = {FIXED_10K: fixed(10_000), FIXED_100K: fixed(100_000), TODAY: today(sigma)}
    out |= {GS.format(n): group(config) for n, config in base.items()}
    out[LOW_CAP] = group(replace(base[100_000], lower_cap=10_000))
    for name, change in VARIANTS.items():
        out |= {f"{GS.format(n)}, {name}": group(replace(base[n], **change)) for n in (10_000, 100_000)}
    return out


def simulate(sigma: float, scenario: str, reps: int, seed: int) -> dict[str, Outcome]:
    """Every procedure on the same simulated votes of reps copies of the population."""
    p = np.tile(population(sigma, scenario), reps)
    rng = np.random.default_rng(seed)
    correct_guess = 2 * rng.binomial(N0, p) >= N0  # argmax of the selection counts, ties to class 0
    q = np.where(correct_guess, p, 1 - p)
    runs = procedures(sigma)
    looks = sorted({look for plan, _ in runs.values() for look in plan})
    counts = np.cumsum(rng.binomial(np.diff((0, *looks))[:, None], q), axis=0)
    row = {look: k for k, look in enumerate(looks)}
    thresholds = norm.cdf(np.array(GRID) / sigma)
    out = {}
    for name, (_, run) in runs.items():
        used, certified = run(lambda look: counts[row[look]], thresholds)
        out[name] = Outcome(N0 + float(used.mean()), tuple(float(100 * np.mean(correct_guess & c)) for c in certified))
    return out


def drop(reference: Outcome, o: Outcome) -> float:
    """The largest loss of certified accuracy (points) over GRID."""
    return max(r - a for r, a in zip(reference.accuracy, o.accuracy))


def top_radius(sigma: float) -> int:
    """The index in GRID of the largest radius certifiable at cap 10,000."""
    config = GroupSequentialConfig(N0, 10_000, ALPHA, sigma, radii=PAPER_RADII)
    return GRID.index(GroupSequentialCertifier(config).target_radius)


def table(results: dict[float, dict[str, Outcome]], names: list[str]) -> str:
    head = " | ".join(f"r={r:g}" for r in GRID)
    header = (f"| sigma | procedure | samples/image | fixed 10k / this | fixed 100k / this | {head} | "
              "worst drop vs 10k | worst drop vs 100k |")
    lines = [header, "|" + " --- |" * (7 + len(GRID))]
    for sigma, outcomes in results.items():
        f10, f100 = outcomes[FIXED_10K], outcomes[FIXED_100K]
        for name in names:
            o = outcomes[name]
            cells = [f"{a:.2f} ({a - f:+.2f})" for a, f in zip(o.accuracy, f10.accuracy)]
            lines.append(f"| {sigma} | {name} | {o.samples:,.0f} | {f10.samples / o.samples:.2f}x | "
                         f"{f100.samples / o.samples:.2f}x | " + " | ".join(cells)
                         + f" | {drop(f10, o):.2f} | {drop(f100, o):.2f} |")
    return "\n".join(lines)


def targets(results: dict[float, dict[str, Outcome]]) -> tuple[str, dict]:
    """Issue 27's targets, met or not, in one scenario."""
    lines = ["| target | sigma | wanted | measured | met |", "| --- | --- | --- | --- | --- |"]
    record: dict = {}

    def check(name: str, sigma: float, wanted: str, measured: str, met: bool) -> None:
        lines.append(f"| {name} | {sigma} | {wanted} | {measured} | {'yes' if met else 'NO'} |")
        record.setdefault(name, {})[str(sigma)] = met

    for sigma, o in results.items():
        f10, f100, top = o[FIXED_10K], o[FIXED_100K], top_radius(sigma)
        g10, g100, low = o[GS.format(10_000)], o[GS.format(100_000)], o[LOW_CAP]
        ratio = f10.samples / g10.samples
        check("cap 10k: fewer samples", sigma, f">= {TARGET_RATIO_10K[sigma]}x", f"{ratio:.2f}x",
              ratio >= TARGET_RATIO_10K[sigma])
        check("cap 10k: accuracy drop vs fixed 10k", sigma, f"<= {TARGET_DROP_10K}", f"{drop(f10, g10):.2f}",
              drop(f10, g10) <= TARGET_DROP_10K)
        check("cap 100k: accuracy drop vs fixed 100k", sigma, f"<= {TARGET_DROP_100K}", f"{drop(f100, g100):.2f}",
              drop(f100, g100) <= TARGET_DROP_100K)
        ratio = f100.samples / g100.samples
        check("cap 100k: fewer samples than fixed 100k", sigma, f">= {TARGET_RATIO_100K}x", f"{ratio:.2f}x",
              ratio >= TARGET_RATIO_100K)
        for name, g in (("cap 100k", g100), ("cap 100k top-only", low)):
            better = g.accuracy[top] > f10.accuracy[top] and g.samples < f10.samples
            check(f"{name}: above fixed 10k at r={GRID[top]:g} with fewer samples", sigma,
                  f"> {f10.accuracy[top]:.2f}, < {f10.samples:,.0f}", f"{g.accuracy[top]:.2f}, {g.samples:,.0f}",
                  better)
    return "\n".join(lines), record


def variants(results: dict[float, dict[str, Outcome]]) -> str:
    """Each tuning variant next to the default: savings and worst drop vs fixed-n at its cap."""
    lines = ["| cap | variant | " + " | ".join(f"sigma {s}: fixed / this, worst drop" for s in results) + " |",
             "|" + " --- |" * (2 + len(results))]
    for n, reference in ((10_000, FIXED_10K), (100_000, FIXED_100K)):
        for name in ("default", *VARIANTS):
            key = GS.format(n) + ("" if name == "default" else f", {name}")
            cells = [f"{o[reference].samples / o[key].samples:.2f}x, {drop(o[reference], o[key]):.2f}"
                     for o in results.values()]
            lines.append(f"| {n:,} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_seconds() -> dict[str, float]:
    """Seconds to build the boundary tables (cold cache) of each cap at sigma 1.0."""
    out = {}
    for n in (10_000, 30_000, 100_000):
        boundary_table.cache_clear()
        start = time.perf_counter()
        GroupSequentialCertifier(GroupSequentialConfig(N0, n, ALPHA, 1.0, radii=PAPER_RADII))
        out[f"{n:,}"] = round(time.perf_counter() - start, 3)
    return out


def main(argv: list[str] | None = None, reps: int = 50, seed: int = 0) -> dict:
    """Simulate both scenarios, write OUTPUT_DIR/results.{md,json}, print the tables."""
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0] if argv else DEFAULT_DIR)
    builds = table_seconds()
    start = time.perf_counter()
    runs = {scenario: {s: simulate(s, scenario, reps, seed) for s in PAPER} for scenario in SCENARIOS}
    seconds = time.perf_counter() - start
    main_names = [FIXED_10K, FIXED_100K, TODAY, *(GS.format(n) for n in (10_000, 30_000, 100_000)), LOW_CAP]
    sections = [(f"n0 {N0}, alpha {ALPHA}, {IMAGES} images x {reps} repetitions per sigma (seed {seed}); "
                 f"simulation {seconds:.1f} s; boundary tables built (cold, sigma 1.0) in {builds} s by cap.")]
    met = {}
    for scenario in SCENARIOS:
        text, met[scenario] = targets(runs[scenario])
        sections += [f"## Top bin {scenario}\n\n{table(runs[scenario], main_names)}",
                     f"### Issue 27's targets, top bin {scenario}\n\n{text}"]
    sections.append(f"## Tuning variants (top bin spread)\n\n{variants(runs['spread'])}")
    text = "\n\n".join(sections)
    record = {"n0": N0, "alpha": ALPHA, "images": IMAGES, "reps": reps, "seed": seed, "radii": list(GRID),
              "paper": {str(s): a for s, a in PAPER.items()}, "variants": VARIANTS, "targets_met": met,
              "scenarios": {sc: {str(s): {name: asdict(o) for name, o in outcomes.items()}
                                 for s, outcomes in by_sigma.items()} for sc, by_sigma in runs.items()},
              "table_build_seconds": builds, "seconds": round(seconds, 2)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.md").write_text(f"# Group-sequential CERTIFY on a simulated population\n\n{text}\n")
    (folder / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print(text)
    return record


if __name__ == "__main__":
    main()
