"""The three procedures of a run (PREDICT, CERTIFY, sequential CERTIFY): how each samples and how
its counts become a result row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dmae_fast.certification.bounds import max_radius
from dmae_fast.certification.core import (
    FIXED_N,
    Certificate,
    certify_from_counts,
    predict_from_counts,
)
from dmae_fast.certification.sequential import (
    PAPER_RADII,
    SequentialCertifier,
    SequentialConfig,
)
from dmae_fast.certification.stream import Decide, ImageCounts, SamplingPlan
from dmae_fast.results import CertifyRow, PredictRow
from dmae_fast.resume import RowRules

if TYPE_CHECKING:
    from dmae_fast.certification.config import CertifyConfig

Row = CertifyRow | PredictRow


@dataclass(frozen=True)
class Procedure:
    """How a run samples (plan, early-stopping rule) and turns counts into result rows."""

    name: str
    level: float  # the Clopper-Pearson level of the certificate's bound (alpha, or alpha / K)
    plan: SamplingPlan
    decide: Decide | None
    decision: Callable[[np.ndarray], Certificate] | None  # CERTIFY: counts -> certificate

    def rules(self, config: CertifyConfig) -> RowRules:
        """What the rows of this run satisfy (checked on the rows a --resume keeps)."""
        if self.decision is None:
            return RowRules("predict", 0, (config.n,), config.alpha, config.sigma, None)
        sizes = tuple(size - config.n0 for size in self.plan.stage_ends) if self.plan.looks else (config.n,)
        return RowRules("certify", config.n0, sizes, self.level, config.sigma, self.name)

    def max_radius(self, config: CertifyConfig) -> float | None:
        """The largest radius this procedure can certify (every sample of the cap voting for the top
        class, at the bound's level); None for PREDICT."""
        return None if self.decision is None else max_radius(config.n, self.level, config.sigma)

    def row(self, config: CertifyConfig, done: ImageCounts, seconds: float) -> Row:
        correct = lambda prediction: int(prediction == done.label)  # noqa: E731
        if self.decision is None:
            p = predict_from_counts(done.counts[0], config.alpha)
            return PredictRow(done.index, done.label, p.prediction, correct(p.prediction), seconds,
                              p.n, p.count1, p.count2, p.pvalue, config.sigma)
        c = self.decision(done.counts)
        return CertifyRow(done.index, done.label, c.prediction, c.radius, correct(c.prediction), seconds,
                          c.n0, c.n, c.n_a, c.p_a_lower, config.sigma, self.name)


def procedure_for(config: CertifyConfig) -> Procedure:
    """The procedure ``config`` asks for (sigma resolved)."""
    if config.predict:
        return Procedure("predict", config.alpha, SamplingPlan.predict(config.n), None, None)
    if not config.sequential:
        fixed = lambda counts: certify_from_counts(counts[0], counts[1], config.alpha, config.sigma)  # noqa: E731
        return Procedure(FIXED_N, config.alpha, SamplingPlan.certify(config.n0, config.n), None, fixed)
    sequential = SequentialCertifier(SequentialConfig(
        config.n0, config.n, config.alpha, config.sigma, config.radii or PAPER_RADII, config.looks, config.futility))
    return Procedure(
        sequential.procedure,
        sequential.level,
        SamplingPlan.sequential(config.n0, sequential.looks),
        sequential.decide,
        lambda counts: sequential.certify(counts[0], int(counts[1, np.argmax(counts[0])]), int(counts[1].sum())),
    )
