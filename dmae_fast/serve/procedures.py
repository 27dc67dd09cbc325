"""What a request asks for (PREDICT or CERTIFY with its n0, n, alpha), its sampling plan, and its answer.

The decisions are the library's (:func:`~dmae_fast.certification.core.predict_from_counts`,
:func:`~dmae_fast.certification.core.certify_from_counts`, and
:class:`~dmae_fast.certification.sequential.SequentialCertifier` for opt-in sequential CERTIFY):
the server only turns class counts into JSON.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dmae_fast.certification.core import (
    ABSTAIN,
    FIXED_N,
    certify_from_counts,
    predict_from_counts,
)
from dmae_fast.certification.sequential import (
    PAPER_RADII,
    SequentialCertifier,
    SequentialConfig,
)
from dmae_fast.certification.stream import Decide, SamplingPlan

PREDICT, CERTIFY = "predict", "certify"


@dataclass(frozen=True)
class Params:
    """One request's parameters, validated against the server's limits (:mod:`.payloads`)."""

    kind: str  # PREDICT or CERTIFY
    n: int  # PREDICT's n; CERTIFY's n (the cap when sequential)
    alpha: float
    n0: int | None = None  # CERTIFY only
    sequential: bool = False  # CERTIFY only: stop each image at the first pre-planned look that decides it


@functools.lru_cache(maxsize=64)
def sequential_certifier(n0: int, n: int, alpha: float, sigma: float) -> SequentialCertifier:
    """The sequential certifier with ``dmae-certify --sequential``'s defaults (looks, paper radii,
    deterministic futility); cached, since building its tables takes milliseconds."""
    return SequentialCertifier(SequentialConfig(n0, n, alpha, sigma, PAPER_RADII))


@dataclass(frozen=True)
class Procedure:
    """A request's plan (the samples every image gets), early-stopping rule and name."""

    params: Params
    sigma: float

    @property
    def sequential(self) -> SequentialCertifier | None:
        p = self.params
        return sequential_certifier(p.n0, p.n, p.alpha, self.sigma) if p.sequential else None

    @property
    def name(self) -> str:
        if self.params.kind == PREDICT:
            return PREDICT
        return self.sequential.procedure if self.params.sequential else FIXED_N

    @property
    def plan(self) -> SamplingPlan:
        p = self.params
        if p.kind == PREDICT:
            return SamplingPlan.predict(p.n)
        if p.sequential:
            return SamplingPlan.sequential(p.n0, self.sequential.looks)
        return SamplingPlan.certify(p.n0, p.n)

    @property
    def decide(self) -> Decide | None:
        return self.sequential.decide if self.params.sequential else None

    def answer(self, counts: np.ndarray, class_names: tuple[str, ...] | None) -> dict:
        """The JSON answer for one image from its counts [len(plan.phases), classes]."""
        plan = self.plan
        out = {"counts": {phase.name.lower(): row.tolist() for phase, row in zip(plan.phases, counts)}}
        p = self.params
        if p.kind == PREDICT:
            d = predict_from_counts(counts[0], p.alpha)
            out.update(prediction=d.prediction, n=d.n, count1=d.count1, count2=d.count2, pvalue=d.pvalue)
        elif p.sequential:
            guess = int(np.argmax(counts[0]))
            d = self.sequential.certify(counts[0], int(counts[1, guess]), int(counts[1].sum()))
            out.update(prediction=d.prediction, radius=d.radius, n0=d.n0, n=d.n, n_a=d.n_a, p_a_lower=d.p_a_lower,
                       level=self.sequential.level)
        else:
            d = certify_from_counts(counts[0], counts[1], p.alpha, self.sigma)
            out.update(prediction=d.prediction, radius=d.radius, n0=d.n0, n=d.n, n_a=d.n_a, p_a_lower=d.p_a_lower)
        out["abstain"] = out["prediction"] == ABSTAIN
        out["class_name"] = None if out["abstain"] or class_names is None else class_names[out["prediction"]]
        return out

    def receipt(self) -> dict:
        """The sampling settings that, with the seed, an image's index and the classifier, give its counts."""
        plan, p = self.plan, self.params
        return {"procedure": self.name, "phases": [phase.name for phase in plan.phases], "sizes": list(plan.sizes),
                "looks": list(plan.looks), "n0": p.n0, "n": p.n, "alpha": p.alpha, "sigma": self.sigma}
