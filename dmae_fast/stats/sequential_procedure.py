"""Sequential CERTIFY (opt-in, the same guarantee at ``alpha``): ``n0`` selection samples, then
estimation samples up to the cap ``n`` with pre-planned looks where an image may stop. Its test is
:class:`~.group_sequential.GroupSequentialCertifier` (``test="exact"``, the default: grid radii) or
:class:`~.sequential.SequentialCertifier` (``test="bonferroni"``)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from dmae_fast.stats.bounds import max_radius
from dmae_fast.stats.decisions import Certificate, Prediction
from dmae_fast.stats.group_sequential import PROCEDURE as EXACT_NAME
from dmae_fast.stats.group_sequential import GroupSequentialCertifier, GroupSequentialConfig
from dmae_fast.stats.plan import SamplingPlan
from dmae_fast.stats.procedure_base import CERTIFY, SEQUENTIAL, Procedure, ProcedureSpec, register
from dmae_fast.stats.rules import RowRules
from dmae_fast.stats.sequential import BONFERRONI_NAME, SequentialCertifier, SequentialConfig


@functools.lru_cache(maxsize=64)
def sequential_certifier(n0: int, n: int, alpha: float, sigma: float, radii: tuple[float, ...] | None = None,
                         looks: tuple[int, ...] | None = None, futility: str | None = None,
                         test: str = "exact",
                         grow: float | None = None) -> GroupSequentialCertifier | SequentialCertifier:
    """The sequential certifier of these settings (None: the configs' defaults; ``grow`` is the exact test's);
    cached (tables take up to a second)."""
    if test == "exact":
        exact = GroupSequentialConfig(n0, n, alpha, sigma, radii, looks)
        exact = exact if futility is None else dataclasses.replace(exact, futility=futility)
        return GroupSequentialCertifier(exact if grow is None else dataclasses.replace(exact, grow=grow))
    bonferroni = SequentialConfig(n0, n, alpha, sigma, radii, looks)
    return SequentialCertifier(bonferroni if futility is None else dataclasses.replace(bonferroni, futility=futility))


@register
class SequentialCertify(Procedure):
    key, kind = SEQUENTIAL, CERTIFY
    names = (f"{EXACT_NAME}-K...", f"{BONFERRONI_NAME}-K...")
    title = "sequential CERTIFY"
    sequential = True
    flag = "sequential"
    reads = ("radii", "looks", "futility", "test", "grow")

    def __init__(self, spec: ProcedureSpec) -> None:
        super().__init__(spec)
        assert spec.n0 is not None, "a CERTIFY spec has n0"
        self.certifier = sequential_certifier(spec.n0, spec.n, spec.alpha, spec.sigma, spec.radii, spec.looks,
                                              spec.futility, spec.test, spec.grow)
        self.name, self.level = self.certifier.procedure, self.certifier.level
        self.plan = SamplingPlan.sequential(spec.n0, self.certifier.looks)
        self.decide = self.certifier.decide

    def result(self, counts: np.ndarray) -> Certificate:
        return self.certifier.certify(counts[0], int(counts[1, np.argmax(counts[0])]), int(counts[1].sum()))

    def fields(self, result: Certificate | Prediction) -> dict[str, object]:
        return {**super().fields(result), "level": self.level}

    def extra(self, result: Certificate | Prediction) -> dict[str, float]:
        """The exact test's certified grid radius (``grid_radius``; 0 when abstaining): the level its decision
        rests on, beside the continuous radius."""
        if not isinstance(self.certifier, GroupSequentialCertifier) or not isinstance(result, Certificate):
            return {}
        return {"grid_radius": self.certifier.grid_radius(result.n_a, result.n)}

    @property
    def columns(self) -> tuple[str, ...]:
        return ("grid_radius",) if isinstance(self.certifier, GroupSequentialCertifier) else ()

    def max_radius(self) -> float:
        """The largest radius the test can certify: the top of the exact test's continuous radius, or the bound's with
        all of the cap's samples for the top class."""
        if isinstance(self.certifier, GroupSequentialCertifier):
            return self.spec.sigma * self.certifier.radius_family.max_z()
        return max_radius(self.spec.n, self.level, self.spec.sigma)

    def rules(self) -> RowRules:
        certificate, grid_radius = None, None  # Bonferroni: Clopper-Pearson at its level, no grid column
        if isinstance(self.certifier, GroupSequentialCertifier):  # the design's limit and the level it certified
            certifier = self.certifier

            def certificate(idx: int, n_a: int, n: int) -> Certificate:
                return certifier.certify(np.ones(1), n_a, n)
            grid_radius = self.certifier.grid_radius
        return RowRules(CERTIFY, self.spec.n0, self.certifier.looks, self.level, self.spec.sigma, self.name,
                        certificate, grid_radius)

    def summary_radii(self, asked: tuple[float, ...] | None, default: tuple[float, ...]) -> tuple[float, ...]:
        """Radius 0 ("certified at all") and the radii of interest: the levels it tests."""
        return tuple(sorted({0.0, *self.certifier.config.resolved_radii()}))

    @classmethod
    def receipt_spec(cls, name: str, n: int, alpha: float, sigma: float, n0: int | None) -> ProcedureSpec:
        test = "bonferroni" if name.startswith(BONFERRONI_NAME) else "exact"
        return dataclasses.replace(super().receipt_spec(name, n, alpha, sigma, n0), test=test)
