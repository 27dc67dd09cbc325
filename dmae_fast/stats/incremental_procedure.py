"""Incremental CERTIFY (``dmae-certify --reference REF.tsv``): a derived classifier certified from a reference run's
certificates, image by image (:mod:`dmae_fast.stats.incremental`), its class counts those of a
:class:`~dmae_fast.engines.paired.PairedEngine` (class pairs). Each image's plan follows its reference row:

* the reference abstained: no sample; the derived classifier abstains;
* the reference's pA_lower is above ``scratch_above``: the derived classifier alone, from scratch (CERTIFY with the
  reference's n0 and n, at its alpha), since there any bound on the disagreement costs a radius level;
* otherwise ``spec.n`` paired samples: the reference's class at pA_lower - zeta_U (failure <= alpha + alpha_zeta).

Where the reference kept its votes (``votes``: ``--keep-votes``), the paired samples are the reference's own first
``spec.n`` estimation samples (the run draws them again with the reference's seed) and only the derived classifier
runs: its class on each is compared with the reference's vote there (the run keeps the classes,
:attr:`IncrementalCertify.keeps`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from dmae_fast.stats.bounds import max_radius
from dmae_fast.stats.decisions import ABSTAIN, Certificate, Prediction, bound_certificate, certify_from_counts
from dmae_fast.stats.incremental import IncrementalCertificate, disagreements, incremental_certificate
from dmae_fast.stats.plan import PAIRED, Phase, SamplingPlan
from dmae_fast.stats.procedure_base import CERTIFY, Procedure, ProcedureSpec, register
from dmae_fast.stats.rules import RowRules

INCREMENTAL = "incremental"  # the key, and the `procedure` column of its rows
SCRATCH_ABOVE = 0.99  # the default: images the reference bounds above it are certified from scratch


@register
class IncrementalCertify(Procedure):
    """``spec.n`` paired samples at ``spec.alpha`` (alpha_zeta) per image, against ``references`` (image index -> the
    reference's certificate, made at ``reference_alpha``; ``classes``: the classifiers', so the counts have
    ``classes ** 2`` columns, or ``classes`` with ``votes``: image index -> the reference's votes on its first
    estimation samples); from scratch where the reference's pA_lower is above ``scratch_above``. Without references
    (a record read back) it states only what rows prove at any alpha."""

    key, kind = INCREMENTAL, CERTIFY
    names = (INCREMENTAL,)
    title = "incremental CERTIFY"

    def __init__(self, spec: ProcedureSpec, references: Mapping[int, Certificate] | None = None,
                 reference_alpha: float | None = None, classes: int | None = None,
                 scratch_above: float = SCRATCH_ABOVE, votes: Mapping[int, np.ndarray] | None = None) -> None:
        super().__init__(spec)
        self.references, self.reference_alpha, self.classes = references, reference_alpha, classes
        self.scratch_above, self.votes = scratch_above, votes
        self.name, self.level = INCREMENTAL, spec.alpha
        # the paired samples: fresh ones that both classifiers classify, or the reference's own that it voted on
        self.plan = SamplingPlan((PAIRED if votes is None else Phase.ESTIMATION,), (spec.n,))
        self.keeps = 0 if votes is None else spec.n
        self._plans: dict[int, SamplingPlan | None] = {}  # no sample where the reference abstained; from scratch
        for index, reference in (references or {}).items():
            if reference.prediction == ABSTAIN:
                self._plans[index] = None
            elif self._scratch(reference):
                self._plans[index] = SamplingPlan.certify(reference.n0, reference.n)

    def _reference(self, index: int) -> Certificate:
        if self.references is None or self.reference_alpha is None or self.classes is None:
            raise ValueError("an incremental procedure needs the reference's certificates")
        return self.references[index]

    def _scratch(self, reference: Certificate) -> bool:
        return reference.prediction != ABSTAIN and reference.p_a_lower > self.scratch_above

    def image_plans(self) -> dict[int, SamplingPlan | None]:
        """No sample where the reference abstained; the reference's n0 + n from scratch above ``scratch_above``."""
        return self._plans

    def image_result(self, index: int, counts: np.ndarray, kept: np.ndarray | None = None) -> IncrementalCertificate:
        reference = self._reference(index)
        assert self.classes is not None and self.reference_alpha is not None
        if self._scratch(reference):  # the derived classes (paired: the pair tables' column sums)
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
                                       self.spec.sigma)

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
        if self._scratch(reference):
            return bound_certificate(0, 0, n_a, n, self.reference_alpha, self.spec.sigma)
        return incremental_certificate(reference, n - n_a, n, self.reference_alpha, self.spec.alpha, self.spec.sigma)

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
        sizes = tuple(sorted({0, self.spec.n, *(reference.n for reference in self.references.values())}))
        return RowRules(CERTIFY, None, sizes, self.level, self.spec.sigma, self.name, self._certificate)
