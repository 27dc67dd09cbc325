"""Incremental CERTIFY (``dmae-certify --reference REF.tsv``): a derived classifier certified from a reference run's
certificates and ``n`` paired samples per image (:mod:`dmae_fast.stats.incremental`), its class counts those of a
:class:`~dmae_fast.engines.paired.PairedEngine` (class pairs). An image the reference abstained on stops after one
paired sample (the plan's one look) and abstains."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dmae_fast.stats.bounds import max_radius
from dmae_fast.stats.decisions import ABSTAIN, Certificate, Prediction
from dmae_fast.stats.incremental import IncrementalCertificate, disagreements, incremental_certificate
from dmae_fast.stats.plan import Phase, SamplingPlan
from dmae_fast.stats.procedure_base import CERTIFY, Procedure, ProcedureSpec, register
from dmae_fast.stats.rules import RowRules

INCREMENTAL = "incremental"  # the key, and the `procedure` column of its rows


@register
class IncrementalCertify(Procedure):
    """``spec.n`` paired samples per image at ``spec.alpha`` (alpha_zeta), against ``references`` (image index ->
    the reference's certificate, made at ``reference_alpha``); ``classes``: the classifiers' (the counts have
    ``classes ** 2``). Without references (a record read back) it states only what rows prove at any alpha."""

    key, kind = INCREMENTAL, CERTIFY
    names = (INCREMENTAL,)
    title = "incremental CERTIFY"
    # not ``sequential``: its one look (an abstained reference) is no sequential test, and answers never name it

    def __init__(self, spec: ProcedureSpec, references: Mapping[int, Certificate] | None = None,
                 reference_alpha: float | None = None, classes: int | None = None) -> None:
        super().__init__(spec)
        self.references, self.reference_alpha, self.classes = references, reference_alpha, classes
        self.name, self.level = INCREMENTAL, spec.alpha
        looks = (1,) if spec.n > 1 else ()
        self.plan = SamplingPlan((Phase.ESTIMATION,), (spec.n,), looks)
        self.decide = self._abstained if looks else None

    def _abstained(self, index: int, counts: np.ndarray, look: int) -> bool:
        """Stop an image the reference abstained on (after the plan's first look)."""
        return self._reference(index).prediction == ABSTAIN

    def _reference(self, index: int) -> Certificate:
        if self.references is None:
            raise ValueError("an incremental procedure needs the reference's certificates")
        return self.references[index]

    def image_result(self, index: int, counts: np.ndarray) -> IncrementalCertificate:
        reference = self._reference(index)
        assert self.classes is not None and self.reference_alpha is not None
        drawn = int(counts[0].sum())
        against = 0 if reference.prediction == ABSTAIN else disagreements(counts[0], self.classes, reference.prediction)
        return incremental_certificate(reference, against, drawn, self.reference_alpha, self.spec.alpha,
                                       self.spec.sigma)

    def _certificate(self, index: int, n_a: int, n: int) -> Certificate:
        reference = self._reference(index)
        assert self.reference_alpha is not None
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
        """The reference's largest radius (the derived bound is below the reference's); None without references."""
        if self.references is None or self.reference_alpha is None or not self.references:
            return None
        most = max(reference.n for reference in self.references.values())
        return max_radius(most, self.reference_alpha, self.spec.sigma)

    def rules(self) -> RowRules:
        """Each row's pA_lower and radius recomputed from its counts and its image's reference certificate; without
        references only what holds at any alpha."""
        sizes = (1, self.spec.n) if self.plan.looks else (self.spec.n,)
        if self.references is None:
            return RowRules(CERTIFY, 0, sizes, None, self.spec.sigma, self.name)
        return RowRules(CERTIFY, 0, sizes, self.level, self.spec.sigma, self.name, self._certificate)
