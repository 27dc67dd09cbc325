"""Incremental CERTIFY (``dmae-certify --reference REF.tsv``): a derived classifier certified from a reference run's
certificates, image by image (:mod:`dmae_fast.stats.incremental`), its class counts those of a
:class:`~dmae_fast.engines.paired.PairedEngine` (class pairs). Each image's plan follows its reference row:

* the reference abstained: no sample; the derived classifier abstains;
* the reference's pA_lower is above ``scratch_above``: the derived classifier alone, from scratch (CERTIFY with the
  reference's n0 and n, at its alpha), since there any bound on the disagreement costs a radius level;
* otherwise ``spec.n`` paired samples: the reference's class at pA_lower - zeta_U (failure <= alpha + alpha_zeta).

Given the derived classifier's expected disagreement ``rate`` (``--disagreement-rate``), each image takes instead the
smallest of the sizes :func:`ladder` offers (5, 10, 20 and 50% of the reference's n) whose zeta_U, at the
disagreements that rate gives at its 90th percentile, keeps the reference's radius within its 0.25 step (from
scratch where none does). The size depends on the reference's counts, which share the paired samples' noise, so
every size's bound is made at alpha_zeta / (the number of sizes): all hold at once with probability
>= 1 - alpha_zeta.

Where the reference kept its votes (``votes``: ``--keep-votes``), the paired samples are the reference's own first
``spec.n`` estimation samples (the run draws them again with the reference's seed) and only the derived classifier
runs: its class on each is compared with the reference's vote there (the run keeps the classes,
:attr:`IncrementalCertify.keeps`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from dmae_fast.stats.bounds import max_radius, radius
from dmae_fast.stats.decisions import ABSTAIN, Certificate, Prediction, bound_certificate, certify_from_counts
from dmae_fast.stats.incremental import (
    IncrementalCertificate,
    derived_lower_bounds,
    disagreement_upper_bounds,
    disagreements,
    incremental_certificate,
)
from dmae_fast.stats.plan import PAIRED, Phase, SamplingPlan
from dmae_fast.stats.procedure_base import CERTIFY, Procedure, ProcedureSpec, register
from dmae_fast.stats.radii import RADIUS_STEP
from dmae_fast.stats.rules import RowRules

INCREMENTAL = "incremental"  # the key, and the `procedure` column of its rows
SCRATCH_ABOVE = 0.99  # the default: images the reference bounds above it are certified from scratch
LADDER = (0.05, 0.1, 0.2, 0.5)  # with a disagreement rate: the sizes an image chooses from, as fractions of the
#                                 reference's n (so each costs at most half of a from-scratch certification)
PREDICTED_QUANTILE = 0.9  # the disagreements a rate is expected to give on n_p samples: this quantile's


def ladder(most: int, n: int) -> tuple[int, ...]:
    """The paired-sample sizes an image chooses from: the :data:`LADDER` fractions of the reference's ``n`` up to
    ``most`` (``--paired-samples``), or ``most`` alone where none is in [1, most]."""
    return tuple(sorted({size for size in (int(n * fraction) for fraction in LADDER) if 1 <= size <= most})) or (most,)


def predicted_bounds(sizes: tuple[int, ...], rate: float, alpha: float) -> dict[int, float]:
    """The bound each size gives at the disagreements ``rate`` predicts there (its 90th percentile)."""
    from scipy.stats import binom  # on first use: 0.4 s of imports that other runs skip

    return {size: float(disagreement_upper_bounds(binom.ppf(PREDICTED_QUANTILE, size, rate), size, alpha))
            for size in sizes}


@register
class IncrementalCertify(Procedure):
    """``spec.n`` paired samples at ``spec.alpha`` (alpha_zeta) per image, against ``references`` (image index -> the
    reference's certificate, made at ``reference_alpha``; ``classes``: the classifiers', so the counts have
    ``classes ** 2`` columns, or ``classes`` with ``votes``: image index -> the reference's votes on its first
    estimation samples); from scratch where the reference's pA_lower is above ``scratch_above``, or, given ``rate``,
    each image's size from :func:`ladder` (module docstring). Without references (a record read back) it states only
    what rows prove at any alpha."""

    key, kind = INCREMENTAL, CERTIFY
    names = (INCREMENTAL,)
    title = "incremental CERTIFY"

    def __init__(self, spec: ProcedureSpec, references: Mapping[int, Certificate] | None = None,
                 reference_alpha: float | None = None, classes: int | None = None,
                 scratch_above: float = SCRATCH_ABOVE, votes: Mapping[int, np.ndarray] | None = None,
                 rate: float | None = None) -> None:
        super().__init__(spec)
        self.references, self.reference_alpha, self.classes = references, reference_alpha, classes
        self.scratch_above, self.votes, self.rate = scratch_above, votes, rate
        self.name, self.level = INCREMENTAL, spec.alpha
        # the paired samples: fresh ones that both classifiers classify, or the reference's own that it voted on
        phase = PAIRED if votes is None else Phase.ESTIMATION
        self.plan = SamplingPlan((phase,), (spec.n,))
        self.keeps = 0 if votes is None else spec.n
        most_n = max((reference.n for reference in (references or {}).values()), default=spec.n)
        self.sizes = (spec.n,) if rate is None else ladder(spec.n, most_n)
        self._predicted = {} if rate is None else predicted_bounds(self.sizes, rate, spec.alpha / len(self.sizes))
        self._plans: dict[int, SamplingPlan | None] = {}  # no sample where the reference abstained; from scratch
        self._scratch: set[int] = set()
        for index, reference in (references or {}).items():
            if reference.prediction == ABSTAIN:
                self._plans[index] = None
                continue
            size = self._size(reference)
            if size is None:
                self._plans[index] = SamplingPlan.certify(reference.n0, reference.n)
                self._scratch.add(index)
            elif size != spec.n:
                self._plans[index] = SamplingPlan((phase,), (size,))

    def _size(self, reference: Certificate) -> int | None:
        """The image's paired samples; None: from scratch."""
        if self.rate is None:
            return None if reference.p_a_lower > self.scratch_above else self.spec.n
        level = np.floor(reference.radius / RADIUS_STEP)
        for size, zeta in self._predicted.items():
            lower = float(derived_lower_bounds(reference.p_a_lower, zeta))
            if lower >= 0.5 and np.floor(radius(lower, self.spec.sigma) / RADIUS_STEP) >= level:
                return size
        return None

    def _reference(self, index: int) -> Certificate:
        if self.references is None or self.reference_alpha is None or self.classes is None:
            raise ValueError("an incremental procedure needs the reference's certificates")
        return self.references[index]

    def image_plans(self) -> dict[int, SamplingPlan | None]:
        """No sample where the reference abstained; the reference's n0 + n from scratch; with a rate, each paired
        image's own size."""
        return self._plans

    def image_result(self, index: int, counts: np.ndarray, kept: np.ndarray | None = None) -> IncrementalCertificate:
        reference = self._reference(index)
        assert self.classes is not None and self.reference_alpha is not None
        if index in self._scratch:  # the derived classes (paired: the pair tables' column sums)
            selection, estimation = counts if self.votes is not None else (
                counts[phase].reshape(self.classes, self.classes).sum(0) for phase in (0, 1))
            return self._from_scratch(certify_from_counts(selection, estimation, self.reference_alpha,
                                                          self.spec.sigma), reference)
        drawn = int(counts.sum())
        if reference.prediction == ABSTAIN:
            against = 0
        elif self.votes is None:
            against = disagreements(counts[0], self.classes, reference.prediction)
        else:
            against = self._against_votes(index, kept, drawn, reference.prediction)
        return incremental_certificate(reference, against, drawn, self.reference_alpha, self.spec.alpha,
                                       self.spec.sigma, len(self.sizes))

    def _against_votes(self, index: int, kept: np.ndarray | None, drawn: int, c_a: int) -> int:
        """Of the derived classes ``kept`` on the reference's first estimation samples, how many differ from ``c_a``
        where the reference voted ``c_a``."""
        assert self.votes is not None
        if kept is None or len(kept) != drawn:
            raise ValueError(f"image {index}: the derived classes of its {drawn} samples were not kept")
        return int(np.count_nonzero(self.votes[index][:drawn] & (kept != c_a)))

    def _from_scratch(self, certificate: Certificate, reference: Certificate) -> IncrementalCertificate:
        """A from-scratch certificate in the incremental row's terms (nothing subtracted, the reference's alpha)."""
        assert self.reference_alpha is not None
        return IncrementalCertificate(**dataclasses.asdict(certificate), disagreements=0, zeta_upper=0.0,
                                      reference_p_a_lower=reference.p_a_lower, alpha=self.reference_alpha)

    def _certificate(self, index: int, n_a: int, n: int) -> Certificate:
        reference = self._reference(index)
        assert self.reference_alpha is not None
        if index in self._scratch:
            return bound_certificate(0, 0, n_a, n, self.reference_alpha, self.spec.sigma)
        return incremental_certificate(reference, n - n_a, n, self.reference_alpha, self.spec.alpha, self.spec.sigma,
                                       len(self.sizes))

    def extra(self, result: Certificate | Prediction) -> dict[str, float]:
        if not isinstance(result, IncrementalCertificate):
            return {}
        return {"disagreements": result.disagreements, "zeta_upper": result.zeta_upper,
                "reference_pA_lower": result.reference_p_a_lower, "alpha": result.alpha}

    @property
    def columns(self) -> tuple[str, ...]:
        return ("disagreements", "zeta_upper", "reference_pA_lower", "alpha")

    def max_radius(self) -> float | None:
        """The reference's largest radius (what its n certifies at its alpha); None without references."""
        if not self.references or self.reference_alpha is None:
            return None
        most = max(reference.n for reference in self.references.values())
        return max_radius(most, self.reference_alpha, self.spec.sigma)

    def rules(self) -> RowRules:
        """Each row's pA_lower and radius recomputed from its counts and its image's reference certificate; without
        references only what holds at any alpha."""
        if self.references is None:
            return RowRules(CERTIFY, None, None, None, self.spec.sigma, self.name)
        sizes = tuple(sorted({0, *self.sizes, *(reference.n for reference in self.references.values())}))
        return RowRules(CERTIFY, None, sizes, self.level, self.spec.sigma, self.name, self._certificate)
