"""The guarantee at every alpha the commands accept, checked in log space independently of the library.

Each test recomputes the probability that matters with its own exact method: binomial log
probabilities from log-gamma, paths summed with log-sum-exp, nothing from scipy.stats or the DP of
dmae_fast.stats.group_sequential. Extremes: 1e-300 (and what cannot be represented below
it), 1e-50, 1e-12, 0.5 and just below 1.
"""

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import betaincinv, gammaln, ndtr

from dmae_fast.base.errors import UserError
from dmae_fast.cli.certify import main
from dmae_fast.stats.boundary_dp import fixed_n_failures
from dmae_fast.stats.bounds import lower_confidence_bound
from dmae_fast.stats.decisions import certify_from_counts
from dmae_fast.stats.group_sequential import (
    FINAL_SHIFT,
    GroupSequentialCertifier,
    GroupSequentialConfig,
)
from dmae_fast.stats.sequential import SequentialCertifier, SequentialConfig
from dmae_fast.stats.settings import PAPER_RADII

N0, CAP = 20, 2_000  # looks every 100 samples: 20 looks, small enough for an exact DP in log space
EXTREMES = (1e-300, 1e-50, 1e-12, 0.5, 1 - 1e-9)
ROUNDING = 1e-9  # Clopper-Pearson bounds from SciPy are quantiles to ~1e-15: their tails reach alpha (1 + 1e-12)


def log_pmf(m: int, q: float) -> np.ndarray:
    """log P(X = i), i = 0..m, X ~ Binomial(m, q) (0 < q < 1)."""
    i = np.arange(m + 1)
    return gammaln(m + 1) - gammaln(i + 1) - gammaln(m - i + 1) + i * math.log(q) + (m - i) * math.log1p(-q)


def log_sum(values: np.ndarray) -> float:
    top = float(np.max(values, initial=-np.inf))
    return top if top == -np.inf else top + math.log(float(np.exp(values - top).sum()))


def log_upper_tail(k: np.ndarray, n: int, x: np.ndarray) -> np.ndarray:
    """log P(X >= k), X ~ Binomial(n, x), for each pair (k >= 1, 0 <= x < 1)."""
    return np.array([log_sum(log_pmf(n, float(p))[int(j):]) if p > 0 else -np.inf for j, p in zip(k, x)])


def log_crossing(looks: tuple[int, ...], failures: np.ndarray, q: float) -> float:
    """log P(F_k <= failures[k] at some look k), F_k the failures among the first looks[k] samples at
    failure probability q. Counts above the largest bound never cross later (F only grows): dropped."""
    top = int(failures.max())
    alive = np.full(top + 1, -np.inf)  # log P(F = i, not crossed yet)
    alive[0], crossed, prev = 0.0, -np.inf, 0
    for look, bound in zip(looks, failures):
        step = log_pmf(look - prev, q)[:top + 1]
        grown = np.full(top + 1, -np.inf)
        for f, log_p in enumerate(step):
            grown[f:] = np.logaddexp(grown[f:], alive[:top + 1 - f] + log_p)
        if bound >= 0:
            crossed = np.logaddexp(crossed, log_sum(grown[:bound + 1]))
            grown[:bound + 1] = -np.inf
        alive, prev = grown, look
    return float(crossed)


def exact_certifier(alpha: float, sigma: float, n: int = CAP) -> GroupSequentialCertifier:
    return GroupSequentialCertifier(GroupSequentialConfig(N0, n, alpha, sigma, radii=PAPER_RADII))


# The exact group-sequential test (item 2 of issue 39).
@pytest.mark.parametrize("sigma", [0.25, 1.0])
@pytest.mark.parametrize("alpha", EXTREMES)
def test_exact_test_false_certificate_probability_at_extreme_alphas(alpha, sigma):
    """At p = t_j exactly (the worst case), level j's boundary is crossed with probability <= alpha;
    "certified at all" spends most of it (power)."""
    c = exact_certifier(alpha, sigma)
    levels = np.flatnonzero((c.failures >= 0).any(axis=1))
    assert 0 in levels  # every one of these alphas certifies something at the cap
    for j in levels:
        log_p = log_crossing(c.looks, c.failures[j], float(ndtr(-c.level_radii[j] / sigma)))
        assert log_p <= math.log(alpha), (j, log_p / math.log(10))
        assert j > 0 or log_p > math.log(alpha / 100)


@pytest.mark.parametrize("alpha", EXTREMES[:-1])
def test_exact_test_boundaries_follow_alpha(alpha):
    """The boundaries move with alpha all the way down (they were frozen from 1e-40 to 1e-300): at the
    cap, "certified at all" takes what fixed-n Clopper-Pearson takes at alpha within FINAL_SHIFT."""
    final = exact_certifier(alpha, 0.25).failures[0, -1]
    assert fixed_n_failures(CAP, alpha, FINAL_SHIFT) <= final <= fixed_n_failures(CAP, alpha, 0.0)


def test_exact_test_refuses_alpha_it_cannot_represent():
    with pytest.raises(UserError, match=r"alpha 1e-301 is below 1e-300, .*fixed-n CERTIFY takes it") as error:
        GroupSequentialConfig(N0, CAP, 1e-301, 0.25, radii=PAPER_RADII)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("alpha,sigma,name", [(0.001, 0.25, "304e16e4"), (0.001, 0.5, "76071921"),
                                              (0.01, 0.25, "157e73bd"), (0.01, 0.5, "67676bf9")])
def test_ordinary_alphas_keep_their_boundaries(alpha, sigma, name):
    """The digests of the boundaries before the change (n = 10,000): its boundaries are those of existing runs."""
    failures = exact_certifier(alpha, sigma, 10_000).failures
    assert hashlib.sha256(np.ascontiguousarray(failures).tobytes()).hexdigest()[:8] == name


# Clopper-Pearson: fixed-n CERTIFY and the Bonferroni sequential test.
COUNTS = [(1962, 2000), (1990, 2000), (2000, 2000), (1500, 2000), (4962, 5000), (1, 100)]


@pytest.mark.parametrize("alpha", [1e-300, 1e-200, 1e-320, 5e-324, 1e-12])
def test_clopper_pearson_bound_at_tiny_alpha(alpha):
    """The bound x has P_x(X >= n_a) <= alpha, and is tight (SciPy's betaincinv gives 0.696 for 1962 of
    2000 at 1e-300, where that probability is 1e52 alpha)."""
    for n_a, n in COUNTS:
        x = lower_confidence_bound(n_a, n, alpha)
        at, above = log_upper_tail(np.array([n_a, n_a]), n, np.array([x, x * (1 + 1e-6)]))
        assert at <= math.log(alpha) + ROUNDING and (above > math.log(alpha) or x < 1e-300), (n_a, n, x)
    cert = certify_from_counts(np.array([3, 17]), np.array([38, 1962]), alpha, 0.25)
    assert cert.p_a_lower == lower_confidence_bound(1962, 2000, alpha)


def test_clopper_pearson_unchanged_at_ordinary_alphas():
    for alpha in (0.001, 0.01, 1e-100):
        for n_a, n in COUNTS:
            assert lower_confidence_bound(n_a, n, alpha) == float(betaincinv(n_a, n - n_a + 1, alpha))


@pytest.mark.parametrize("alpha", EXTREMES)
def test_bonferroni_certificates_at_extreme_alphas(alpha):
    """Every certificate the Bonferroni test can give, at every look: its pA_lower x has
    P_x(X >= n_a) <= alpha / K (the union bound over the K looks then gives alpha)."""
    c = SequentialCertifier(SequentialConfig(N0, CAP, alpha, 0.25, radii=PAPER_RADII))
    for look, need in zip(c.looks, c.need[:, 0]):
        n_a = np.arange(need, look + 1)
        x = np.array([c.certify(np.array([0, N0]), int(k), look).p_a_lower for k in n_a])
        assert np.all(x >= 0.5)
        assert np.all(log_upper_tail(n_a, look, x) <= math.log(c.level) + ROUNDING), look
        if need > 0:
            assert c.certify(np.array([0, N0]), int(need) - 1, look).radius == 0.0


def test_bonferroni_refuses_a_level_below_the_normal_doubles():
    with pytest.raises(UserError, match=r"alpha 1e-310 over 6 looks is below the smallest normal double"):
        SequentialCertifier(SequentialConfig(N0, CAP, 1e-310, 0.25, radii=PAPER_RADII))


# Through the command.
def test_command_at_alpha_1e_300_claims_only_what_is_proven(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The issue's command (it certified at 600 of 600 votes: probability 2^-600 at pA = 1/2): each
    row abstains or its votes are at least as unlikely as 1e-300 at the threshold it claims."""
    out = tmp_path / "tiny.tsv"
    rc = main(["--ckpt", "demo", "--data", "demo", "--seed", "0",
               "--max", "1", "--n0", str(N0), "--n", str(CAP), "--sequential",
               "--alpha", "1e-300", "--body", "plain", "--device", "cpu", "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    header, *lines = [line.split("\t") for line in out.read_text().splitlines()]
    rows = [dict(zip(header, line)) for line in lines]
    assert rows and all(r["procedure"].startswith("group-sequential-exact-K20-") for r in rows)
    for r in rows:
        if r["predict"] != "-1":
            threshold = max(0.5, float(r["pA_lower"]))
            tail = log_upper_tail(np.array([int(r["nA"])]), int(r["n"]), np.array([threshold]))[0]
            assert tail <= math.log(1e-300), r
