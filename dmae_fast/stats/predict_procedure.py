"""Cohen et al.'s PREDICT: the top two classes of ``n`` samples, abstaining unless the binomial test
separates them at ``alpha`` (:func:`~dmae_fast.stats.decisions.predict_from_counts`)."""

from __future__ import annotations

import numpy as np

from dmae_fast.stats.decisions import Prediction, predict_from_counts
from dmae_fast.stats.plan import SamplingPlan
from dmae_fast.stats.procedure_base import PREDICT, Procedure, ProcedureSpec, register
from dmae_fast.stats.rules import RowRules


@register
class Predict(Procedure):
    key = kind = PREDICT
    names = (PREDICT,)
    title = "PREDICT"

    def __init__(self, spec: ProcedureSpec) -> None:
        super().__init__(spec)
        self.name, self.level, self.plan = PREDICT, spec.alpha, SamplingPlan.predict(spec.n)

    def result(self, counts: np.ndarray) -> Prediction:
        return predict_from_counts(counts[0], self.spec.alpha)

    def rules(self) -> RowRules:
        return RowRules(PREDICT, 0, (self.spec.n,), self.spec.alpha, self.spec.sigma, None)
