"""Incremental certification's statistics (issue 59, step 1; dmae_fast/stats/incremental.py): the disagreement
bound's coverage, exactly over its finite design, and the derived certificate's failure rate by simulation with known
probabilities, against a deliberately wrong bound (the point estimate) that the same check flags."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from dmae_fast.stats.bounds import lower_confidence_bounds
from dmae_fast.stats.decisions import ABSTAIN, Certificate, bound_certificate
from dmae_fast.stats.incremental import (
    derived_lower_bounds,
    disagreement_upper_bounds,
    incremental_certificate,
)
from dmae_fast.stats.incremental_procedure import IncrementalCertify, ladder
from dmae_fast.stats.plan import SamplingPlan
from dmae_fast.stats.procedure import CERTIFY, ProcedureSpec


@pytest.mark.parametrize("n_p", [1, 20, 200, 1000])
@pytest.mark.parametrize("alpha_zeta", [1e-3, 0.01, 0.05])
def test_the_disagreement_bound_covers_at_every_rate_exactly(n_p, alpha_zeta):
    """P(zeta_upper(D) < zeta) <= alpha_zeta for D ~ Binomial(n_p, zeta), at every zeta: the miss probability only
    jumps where zeta passes one of the n_p + 1 bounds, so checking just above each bound (and between) is exact."""
    uppers = disagreement_upper_bounds(np.arange(n_p + 1), n_p, alpha_zeta)
    assert np.all(np.diff(uppers) > 0) and uppers[-1] == 1.0
    rates = np.unique(np.concatenate([np.nextafter(uppers, 2.0), np.linspace(0, 1, 501)]))
    rates = rates[(rates > 0) & (rates <= 1)]
    for zeta in rates:
        missed = np.flatnonzero(uppers < zeta)  # D = d gives a bound below the true rate
        miss = float(binom.pmf(missed, n_p, zeta).sum())
        assert miss <= alpha_zeta * (1 + 1e-9), (zeta, miss)
    # and the bound is not loose: just below a bound, the miss probability nears alpha_zeta somewhere
    worst = max(float(binom.pmf(np.flatnonzero(uppers < z), n_p, z).sum()) for z in np.nextafter(uppers[:-1], 2.0))
    assert worst > alpha_zeta / 3


def test_the_derived_certificate():
    reference = bound_certificate(3, 100, 9990, 10000, 0.001, 0.25)
    none_disagree = incremental_certificate(reference, 0, 1000, 0.001, 0.001, 0.25)
    assert none_disagree.prediction == 3 and none_disagree.alpha == pytest.approx(0.002)
    # the figure: an all-but-ten-correct image at sigma 0.25 loses radius to the bound on zero disagreements
    zeta = 1 - float(lower_confidence_bounds(1000, 1000, 0.001))
    assert none_disagree.zeta_upper >= zeta and none_disagree.p_a_lower <= reference.p_a_lower - zeta
    assert 0 < none_disagree.radius < reference.radius
    assert incremental_certificate(reference, 1000, 1000, 0.001, 0.001, 0.25).prediction == ABSTAIN
    abstained = Certificate(ABSTAIN, 0.0, 100, 10000, 4000, 0.38)
    assert incremental_certificate(abstained, 0, 1000, 0.001, 0.001, 0.25).prediction == ABSTAIN
    with pytest.raises(ValueError, match="disagreements must lie in"):
        incremental_certificate(reference, 1001, 1000, 0.001, 0.001, 0.25)
    assert float(disagreement_upper_bounds(0, 0, 0.01)) == 1.0  # no paired sample: nothing is known


def _false_certificates(p, z, w, n, n_p, alpha, alpha_zeta, trials, rng, bound):
    """Simulated reference runs of n estimation samples at P(f = cA) = p whose first n_p are paired with a derived
    f' (P(f = cA, f' != cA) = z, P(f != cA, f' = cA) = w): how many certify f' at a bound above its true
    P(f' = cA) = p - z + w. ``bound``: the disagreement bound under test (d, n_p) -> zeta."""
    first = rng.multinomial(n_p, [p - z, z, w, 1 - p - w], size=trials)  # (f, f') = (A, A), (A, -), (-, A), (-, -)
    n_a = first[:, 0] + first[:, 1] + rng.binomial(n - n_p, p, size=trials)
    p_a_lower = np.where(n_a > 0, lower_confidence_bounds(np.maximum(n_a, 1), n, alpha), 0.0)
    derived = derived_lower_bounds(p_a_lower, bound(first[:, 1], n_p))
    return int(np.sum((derived >= 0.5) & (derived > p - z + w)))


# (p, z, w): a confident image with more disagreement than its margin can hide, the paper's ~0.5% int8 rate, and
# one where f' also gains cA elsewhere (w > 0: P(f' = cA) higher, the bound still sound)
CASES = [(0.99, 0.01, 0.0), (0.995, 0.005, 0.0), (0.9, 0.02, 0.01)]


@pytest.mark.parametrize(("p", "z", "w"), CASES)
def test_false_certificates_stay_within_alpha_plus_alpha_zeta_and_the_point_estimate_is_flagged(p, z, w):
    """>= 20,000 simulated images per case: the derived bound's false certificates stay within alpha + alpha_zeta
    (a one-sided binomial check at 1e-4); where the bound is tight (w = 0), the same count with the point estimate
    d / n_p for zeta_upper exceeds it."""
    alpha = alpha_zeta = 0.001
    n, n_p, trials = 10_000, 1_000, 40_000
    rng = np.random.default_rng(59)

    def sound(d, m):
        return disagreement_upper_bounds(d, m, alpha_zeta)

    def point(d, m):
        return d / m

    false = _false_certificates(p, z, w, n, n_p, alpha, alpha_zeta, trials, rng, sound)
    allowed = int(binom.ppf(1 - 1e-4, trials, alpha + alpha_zeta))
    assert false <= allowed, (false, allowed)
    if w == 0:
        wrong = _false_certificates(p, z, w, n, n_p, alpha, alpha_zeta, trials, np.random.default_rng(59), point)
        assert wrong > allowed, (wrong, allowed)


# --------------------------------------------------------------------------- paired samples (PairedEngine)


def test_paired_counts_are_the_joint_table_and_other_phases_count_the_derived_alone(tiny_engine):
    """The paired engine's counts of the paired phase: their rows sum to the reference's counts of the same noisy
    inputs (drawn again from the noise key by a run of the reference alone), their columns to the derived engine's.
    Rows of another phase (an image certified from scratch) count the derived class alone, as the pair (0, d)."""
    import copy

    import torch

    from dmae_fast.batching.smoothing import Smoothing
    from dmae_fast.batching.stream import StreamingCertifier
    from dmae_fast.engines.paired import PairedEngine
    from dmae_fast.engines.torch_engine import TorchEngine
    from dmae_fast.stats.incremental import disagreements
    from dmae_fast.stats.plan import PAIRED, SamplingPlan

    reference, n_p, classes = tiny_engine, 300, tiny_engine.spec.num_classes
    model = copy.deepcopy(reference.model)
    with torch.no_grad():  # a derived classifier that disagrees now and then
        model.head.weight.add_(0.3 * torch.randn(model.head.weight.shape, generator=torch.Generator().manual_seed(5)))
    derived = TorchEngine(model, reference.device)
    generator = torch.Generator().manual_seed(11)
    images = [(index, torch.rand(reference.input_shape, generator=generator), 0) for index in (3, 40, 41, 977)]

    def counts(engine, plan):
        smoothing = Smoothing(engine, 0.5, 2024, 128)
        return {done.index: done.counts for done in StreamingCertifier(smoothing, plan).run(images)}

    paired_plan, scratch_plan = SamplingPlan((PAIRED,), (n_p,)), SamplingPlan.certify(20, n_p)
    pairs = counts(PairedEngine(reference, derived), paired_plan)
    by_reference, own = counts(reference, paired_plan), counts(derived, paired_plan)
    seen = 0
    for index, (joint,) in pairs.items():
        table = joint.reshape(classes, classes)
        assert np.array_equal(table.sum(axis=1), by_reference[index][0]), index
        assert np.array_equal(table.sum(axis=0), own[index][0]), index
        c_a = int(np.argmax(by_reference[index][0]))
        seen += disagreements(joint, classes, c_a)
        assert disagreements(joint, classes, c_a) == table[c_a].sum() - table[c_a, c_a]
    assert seen > 0  # the perturbation is real: the check above compared two different classifiers
    scratch, alone = counts(PairedEngine(reference, derived), scratch_plan), counts(derived, scratch_plan)
    for index, counted in scratch.items():
        assert np.array_equal(counted[:, :classes], alone[index]) and not counted[:, classes:].any(), index


def test_engines_that_cannot_be_paired_are_refused_in_one_line(tiny_engine):
    from helpers import tiny_engine_of

    from dmae_fast.base.errors import UserError
    from dmae_fast.engines.paired import PairedEngine

    other = tiny_engine_of(input_size=16)
    with pytest.raises(UserError, match=r"^cannot pair the engines: the reference takes inputs of shape"):
        PairedEngine(tiny_engine, other)


def test_the_pooled_bound_covers_the_average_rate_of_different_images():
    """dmae-export --check-agreement bounds the average disagreement of K images from the total of their counts
    (one binomial per image, each at its own rate): simulated with known, very different rates, the bound misses the
    average no more often than alpha (a one-sided binomial allowance at 1e-4), near where a single rate would."""
    rng = np.random.default_rng(7)
    rates = np.concatenate([np.zeros(20), np.full(20, 0.001), np.full(8, 0.02), np.array([0.2, 0.5])])
    n_p, trials, alpha = 200, 200_000, 0.01
    totals = rng.binomial(n_p, rates, size=(trials, len(rates))).sum(axis=1)
    missed = int(np.sum(disagreement_upper_bounds(totals, n_p * len(rates), alpha) < rates.mean()))
    assert missed <= binom.ppf(1 - 1e-4, trials, alpha), missed / trials


@pytest.mark.parametrize("p", [0.96, 0.995])
def test_sizes_chosen_by_the_reference_counts_keep_alpha_plus_alpha_zeta(p):
    """--disagreement-rate: each image's paired samples are chosen (:func:`ladder`) from the reference's counts, which
    include those very samples. Over 20,000 simulated images of known P(f = cA) = p and disagreement z = 0.005 (the
    rate given), a row claims more than f''s true P(f' = cA) = p - z at most at alpha + alpha_zeta (a one-sided
    binomial check at 1e-4); the sizes chosen vary, and from scratch rows are fresh CERTIFY runs of f'."""
    alpha = alpha_zeta = 0.001
    n, z, sigma, trials = 10_000, 0.005, 0.5, 20_000
    rng = np.random.default_rng(60)
    sizes = ladder(n, n)
    edges = np.diff((0, *sizes, n))
    segments = np.stack([rng.multinomial(m, [p - z, z, 1 - p], size=trials) for m in edges], axis=1)
    n_a = segments[:, :, :2].sum(axis=(1, 2))
    d_by_size = dict(zip(sizes, np.cumsum(segments[:, :, 1], axis=1).T))
    references = {i: bound_certificate(1, 100, int(n_a[i]), n, alpha, sigma) for i in range(trials)}
    procedure = IncrementalCertify(ProcedureSpec(CERTIFY, n, alpha_zeta, sigma, 0, name="incremental"), references,
                                   alpha, 2, rate=z)
    plans = procedure.image_plans()
    chosen = np.array([_paired_size(plans.get(i, procedure.plan)) for i in range(trials)])
    paired = chosen > 0
    disagree = np.select([chosen == size for size in sizes], [d_by_size[size] for size in sizes], 0)
    certificate = procedure.rules().certificate
    assert certificate is not None
    derived = np.zeros(trials)
    for i in np.flatnonzero(paired):  # the rows' own bound (alpha_zeta split over the sizes)
        derived[i] = certificate(int(i), int(chosen[i] - disagree[i]), int(chosen[i])).p_a_lower
    fresh = rng.binomial(n, p - z, size=trials)  # the others (none abstained) from scratch, on fresh noise
    derived = np.where(paired, derived, lower_confidence_bounds(np.maximum(fresh, 1), n, alpha))
    false = int(np.sum((derived >= 0.5) & (derived > p - z)))
    allowed = int(binom.ppf(1 - 1e-4, trials, alpha + alpha_zeta))
    assert false <= allowed, (false, allowed)
    assert len(set(chosen[paired].tolist())) >= 2  # the choice varies with the counts


def _paired_size(plan: SamplingPlan | None) -> int:
    """An incremental image plan's paired samples; 0 where it draws none or certifies from scratch."""
    return plan.sizes[0] if plan is not None and len(plan.sizes) == 1 else 0
