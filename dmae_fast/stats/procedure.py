"""One procedure type for PREDICT, fixed-n CERTIFY and sequential CERTIFY.

A :class:`Procedure` is what a run (``dmae-certify``, one process or sharded), a request
(``dmae-serve``) or a replay asks for: its sampling plan (the noisy samples of every image, and
the looks where sequential CERTIFY may stop), its stopping rule, and its decision from class
counts (:meth:`Procedure.result`: a :class:`~dmae_fast.stats.decisions.Prediction` or a
:class:`~dmae_fast.stats.decisions.Certificate`). Result rows and JSON answers only render
that result. The decisions themselves are the library's: :func:`~.decisions.predict_from_counts`,
:func:`~.decisions.certify_from_counts`, and for sequential CERTIFY
:class:`~.group_sequential.GroupSequentialCertifier` (``test="exact"``, the default: grid radii)
or :class:`~.sequential.SequentialCertifier` (``test="bonferroni"``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dmae_fast.stats.bounds import max_radius
from dmae_fast.stats.decisions import (
    FIXED_N,
    Certificate,
    Prediction,
    certify_from_counts,
    predict_from_counts,
)
from dmae_fast.stats.group_sequential import (
    GroupSequentialCertifier,
    GroupSequentialConfig,
)
from dmae_fast.stats.plan import Decide, SamplingPlan
from dmae_fast.stats.rules import RowRules
from dmae_fast.stats.sequential import SequentialCertifier, SequentialConfig
from dmae_fast.stats.settings import PAPER_RADII

PREDICT, CERTIFY = "predict", "certify"


@dataclass(frozen=True)
class ProcedureSpec:
    """What is asked: PREDICT with ``n`` samples, or CERTIFY with ``n0`` + ``n`` (``n`` the cap
    when ``sequential``; ``test``, ``radii``, ``looks`` and ``futility`` only matter then;
    ``futility`` None: the test's own default)."""

    kind: str  # PREDICT or CERTIFY
    n: int
    alpha: float
    sigma: float
    n0: int | None = None  # CERTIFY only
    sequential: bool = False
    radii: tuple[float, ...] = PAPER_RADII
    looks: tuple[int, ...] | None = None
    futility: str | None = None
    test: str = "exact"  # sequential CERTIFY's test: "exact" (group-sequential) or "bonferroni"


Sequential = GroupSequentialCertifier | SequentialCertifier


@functools.lru_cache(maxsize=64)
def sequential_certifier(n0: int, n: int, alpha: float, sigma: float, radii: tuple[float, ...] = PAPER_RADII,
                         looks: tuple[int, ...] | None = None, futility: str | None = None,
                         test: str = "exact") -> Sequential:
    """The sequential certifier of these settings; cached (its tables take up to a second to build)."""
    if test == "exact":
        exact = GroupSequentialConfig(n0, n, alpha, sigma, radii, looks)
        return GroupSequentialCertifier(exact if futility is None else dataclasses.replace(exact, futility=futility))
    bonferroni = SequentialConfig(n0, n, alpha, sigma, radii, looks)
    return SequentialCertifier(bonferroni if futility is None else dataclasses.replace(bonferroni, futility=futility))


class Procedure:
    """A :class:`ProcedureSpec` made concrete: ``name``, ``level`` (the Clopper-Pearson level of
    the bound: alpha, or alpha / K for sequential CERTIFY), ``plan``, ``decide`` and ``result``."""

    def __init__(self, spec: ProcedureSpec) -> None:
        self.spec = spec
        self.sequential: Sequential | None = None
        self.decide: Decide | None = None
        if spec.kind == PREDICT:
            self.name, self.level, self.plan = PREDICT, spec.alpha, SamplingPlan.predict(spec.n)
            return
        assert spec.n0 is not None, "a CERTIFY spec has n0"
        if not spec.sequential:
            self.name, self.level, self.plan = FIXED_N, spec.alpha, SamplingPlan.certify(spec.n0, spec.n)
        else:
            self.sequential = sequential_certifier(spec.n0, spec.n, spec.alpha, spec.sigma, spec.radii, spec.looks,
                                                   spec.futility, spec.test)
            self.name, self.level = self.sequential.procedure, self.sequential.level
            self.plan = SamplingPlan.sequential(spec.n0, self.sequential.looks)
            self.decide = self.sequential.decide

    @property
    def kind(self) -> str:
        return self.spec.kind

    def result(self, counts: np.ndarray) -> Certificate | Prediction:
        """The decision from one image's class counts [len(plan.phases), classes]."""
        s = self.spec
        if s.kind == PREDICT:
            return predict_from_counts(counts[0], s.alpha)
        if self.sequential is None:
            return certify_from_counts(counts[0], counts[1], s.alpha, s.sigma)
        return self.sequential.certify(counts[0], int(counts[1, np.argmax(counts[0])]), int(counts[1].sum()))

    @property
    def grid(self) -> bool:
        """Whether certificates are radii of the grid of interest (the exact sequential test)."""
        return isinstance(self.sequential, GroupSequentialCertifier)

    def max_radius(self) -> float | None:
        """The largest radius this procedure can certify (every sample of the cap voting for the top
        class: at the bound's level, or the top grid radius reachable); None for PREDICT."""
        if self.kind == PREDICT:
            return None
        if isinstance(self.sequential, GroupSequentialCertifier):  # self.grid
            return self.sequential.target_radius
        return max_radius(self.spec.n, self.level, self.spec.sigma)

    def rules(self) -> RowRules:
        """What result rows of this procedure satisfy (checked on the rows a --resume keeps)."""
        s = self.spec
        if s.kind == PREDICT:
            return RowRules(PREDICT, 0, (s.n,), s.alpha, s.sigma, None)
        n0 = s.n0
        assert n0 is not None, "a CERTIFY spec has n0"
        sizes = tuple(end - n0 for end in self.plan.stage_ends) if self.plan.looks else (s.n,)
        certificate: Callable[[int, int], Certificate] | None = None
        if isinstance(self.sequential, GroupSequentialCertifier):
            # self.grid: grid radii and Phi(r / sigma), not a Clopper-Pearson bound at the level
            grid = self.sequential

            def certificate(n_a: int, n: int) -> Certificate:
                return grid.certify(np.ones(1), n_a, n)
        return RowRules(CERTIFY, s.n0, sizes, self.level, s.sigma, self.name, certificate)

    def receipt(self) -> dict[str, Any]:
        """The sampling settings that, with the seed, an image's index and the classifier, give its counts
        (``sequential`` said outright: a sequential plan of one look has no looks)."""
        s, plan = self.spec, self.plan
        return {"procedure": self.name, "phases": [phase.name for phase in plan.phases], "sizes": list(plan.sizes),
                "looks": list(plan.looks), "n0": s.n0, "n": s.n, "alpha": s.alpha, "sigma": s.sigma,
                "sequential": self.sequential is not None}
