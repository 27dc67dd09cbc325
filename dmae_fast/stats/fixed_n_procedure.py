"""Cohen et al.'s CERTIFY with a fixed number of samples: ``n0`` selection samples guess the class, ``n`` fresh
estimation samples bound its probability at ``alpha`` (:func:`~dmae_fast.stats.decisions.certify_from_counts`)."""

from __future__ import annotations

import numpy as np

from dmae_fast.stats.bounds import max_radius
from dmae_fast.stats.decisions import FIXED_N, Certificate, certify_from_counts
from dmae_fast.stats.plan import SamplingPlan
from dmae_fast.stats.procedure_base import CERTIFY, Procedure, ProcedureSpec, register
from dmae_fast.stats.rules import RowRules


@register
class FixedNCertify(Procedure):
    key = kind = CERTIFY
    names = (FIXED_N,)
    title = "CERTIFY"

    def __init__(self, spec: ProcedureSpec) -> None:
        super().__init__(spec)
        assert spec.n0 is not None, "a CERTIFY spec has n0"
        self.name, self.level, self.plan = FIXED_N, spec.alpha, SamplingPlan.certify(spec.n0, spec.n)

    def result(self, counts: np.ndarray) -> Certificate:
        return certify_from_counts(counts[0], counts[1], self.spec.alpha, self.spec.sigma)

    def max_radius(self) -> float:
        """Every estimation sample voting for the top class, at the bound's level."""
        return max_radius(self.spec.n, self.level, self.spec.sigma)

    def rules(self) -> RowRules:
        return RowRules(CERTIFY, self.spec.n0, (self.spec.n,), self.level, self.spec.sigma, self.name)
