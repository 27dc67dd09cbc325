"""The continuous radius of the exact group-sequential test (dmae_fast.stats.sequential_radius), checked exactly.

Over every outcome (stopping look, failures) a design can reach, computed by a DP over the failure counts with the
design's own stopping rule: the radius is never below the grid radius certified (consistency), and P_p(p_L > p) is
at most alpha at every p of a grid dense near each threshold of the family (coverage, exact up to the DP's
floating-point rounding)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.signal import fftconvolve
from scipy.special import ndtr
from scipy.stats import binom

from dmae_fast.stats.group_sequential import GROW, GroupSequentialCertifier, GroupSequentialConfig

N0 = 100
DESIGNS = {  # (n, alpha, sigma, lower_cap, futility, grow): small enough to enumerate every outcome in seconds
    "upper futility, grid stops": (2_000, 0.01, 0.5, None, "upper", math.inf),
    "no futility": (2_000, 0.01, 0.25, None, "none", GROW),
    "lower cap, grow 0": (4_000, 0.01, 1.0, 1_000, "upper", 0.0),
    "alpha 0.001": (3_000, 0.001, 0.5, None, "deterministic", GROW),
}


def certifier(n: int, alpha: float, sigma: float, lower_cap: int | None, futility: str,
              grow: float) -> GroupSequentialCertifier:
    radii = tuple(0.25 * i for i in range(1, 13))
    looks = tuple(range(100, n + 1, 100))
    return GroupSequentialCertifier(GroupSequentialConfig(N0, n, alpha, sigma, radii, looks, futility=futility,
                                                          lower_cap=lower_cap, grow=grow))


def outcomes(c: GroupSequentialCertifier, p: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(look, failures, probability [len(p), failures]) of every way an image stops, at each P(vote for cA) in ``p``
    (exact DP, every p at once)."""
    alive, previous, out = np.ones((len(p), 1)), 0, []
    for k, look in enumerate(c.looks):
        step = binom.pmf(np.arange(look - previous + 1), look - previous, 1 - p[:, None])
        alive = np.maximum(fftconvolve(alive, step, axes=1), 0)
        previous = look
        failures = np.arange(alive.shape[1])
        stop = c.stop(k, look - failures)
        out.append((k, failures[stop], alive[:, stop]))
        alive = np.where(stop, 0.0, alive)
    return out


def limits(c: GroupSequentialCertifier, k: int, failures: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid radius, continuous radius, pA_lower) of images stopped at look k with ``failures`` (-1, -1, 0: abstain)."""
    look = c.looks[k]
    grid = c.certified_radius(k, look - failures)
    certificates = [c.certify(np.array([N0, 0]), int(look - f), look) for f in failures]
    radius = np.array([cert.radius if g >= 0 else -1.0 for cert, g in zip(certificates, grid)])
    return grid, radius, np.array([cert.p_a_lower for cert in certificates])


@pytest.fixture(scope="module", params=list(DESIGNS))
def design(request) -> tuple[GroupSequentialCertifier, list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]]:
    """A design and, for every look, its stopping failures with their grid and continuous radii."""
    c = certifier(*DESIGNS[request.param])
    table = []
    for k, failures, _ in outcomes(c, np.array([0.5])):  # p = 1/2 reaches every outcome (all have mass > 0)
        table.append((k, failures, *limits(c, k, failures)))
    return c, table


def test_the_radius_is_never_below_the_grid_radius_nor_reaches_the_next_level(design):
    c, table = design
    reached = 0
    for k, failures, grid, radius, _ in table:
        certified = grid >= 0
        assert np.all(radius[certified] >= grid[certified]) and np.all(radius[~certified] == -1)
        level = c.levels(k, c.looks[k] - failures[certified]) - 1
        following = c.level_radii[np.minimum(level + 1, len(c.level_radii) - 1)]
        assert np.all((radius[certified] < following) | (level == len(c.level_radii) - 1) | (level == c.target))
        reached += int(np.sum(radius[certified] > grid[certified]))
    assert reached > 0  # the continuous radius does go beyond the grid somewhere


def test_false_certificates_stay_within_alpha_at_every_p(design):
    """P_p(p < pA_lower) <= alpha, exactly over the outcomes, at about 650 values of p: spread over (0, 1) and over
    z in [0, 4], and just below each threshold of the family (the worst case of each test) and each grid level
    (bench/results/2026-12-06-sequential-radius checks the default designs at 2,000+ values)."""
    c, table = design
    alpha = c.config.alpha
    z_family = np.concatenate([c.radius_family.z] + [c.radius_family.interval(j)[0] for j in range(c.target + 1)])
    just_below = ndtr(z_family[z_family > 0]) - 1e-9
    grid_p = np.concatenate([np.linspace(0.001, 0.999, 200), just_below, ndtr(np.linspace(0, 4, 300))])
    lookup = {k: (failures, p_lower) for k, failures, _, _, p_lower in table}
    false = np.zeros(len(grid_p))
    for k, failures, probability in outcomes(c, grid_p):
        known, p_lower = lookup[k]
        false += np.where(p_lower[np.searchsorted(known, failures)] > grid_p[:, None], probability, 0.0).sum(axis=1)
    assert np.all(false <= alpha), [(p, f) for p, f in zip(grid_p, false) if f > alpha]
    assert false.max() > alpha / 10  # the check bites: some p comes near alpha


def test_grow_only_lets_images_draw_on_and_the_radius_grows_with_it():
    """``grow`` turns stops of the grid test into draws, never the reverse (smaller grow: a subset of the stops),
    and an image whose every vote is for cA, stopped by the grid test as soon as the top level is certified, draws
    on towards the cap under the default and ends with a larger radius (inf: exactly the grid test's stops)."""
    designs = {grow: GroupSequentialCertifier(GroupSequentialConfig(N0, 10_000, 0.001, 0.25, grow=grow))
               for grow in (math.inf, 0.5, GROW, 0.0)}
    grid = designs[math.inf]
    for k, look in enumerate(grid.looks):
        n_a = np.arange(look + 1)
        stops = [c.stop(k, n_a) for c in designs.values()]
        assert np.array_equal(stops[0], super(GroupSequentialCertifier, grid).stop(k, n_a))
        for looser, tighter in zip(stops, stops[1:]):
            assert np.all(looser | ~tighter)
    ends = {}
    for grow, c in designs.items():
        stopped, n_a = c.run(np.array(c.looks)[:, None])
        look = c.looks[int(stopped[0])]
        ends[grow] = (look, c.certify(np.array([N0, 0]), look, look).radius)
    assert ends[math.inf][0] < 7_000 and ends[GROW][0] > ends[math.inf][0] * 1.3
    assert ends[GROW][1] > ends[math.inf][1] + 0.02 and ends[0.0][1] >= ends[GROW][1]
