"""What a procedure is, and the registry that finds one by name.

A :class:`Procedure` is what a run, a request or a replay asks for: its sampling plan, its stopping rule
(``decide``), its decision from class counts (``result``) and what only it knows about that decision (answer
fields, row rules, receipt, request flag, summary radii), so that drivers, the server and replay name none.
:mod:`dmae_fast.stats.procedure` registers the built-in ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.stats.decisions import Certificate, Prediction
from dmae_fast.stats.plan import Decide, SamplingPlan
from dmae_fast.stats.rules import RowRules

PREDICT, CERTIFY = "predict", "certify"  # the kinds: the endpoints, and the kinds of results files
SEQUENTIAL = "sequential"  # the key of the procedure that ``ProcedureSpec(CERTIFY, ..., sequential=True)`` asks for
SOUND_SUFFIX = " sound"  # ends the name of a procedure run with --sound ("certify sound"): rows and answers say so


@dataclass(frozen=True)
class ProcedureSpec:
    """What is asked: PREDICT with ``n`` samples, or CERTIFY with ``n0`` + ``n``; ``name``: the key of a
    registered procedure (None: the kind's own, or sequential CERTIFY with ``sequential``, ``n`` its cap).
    ``radii``, ``looks``, ``futility``, ``grow`` (None: the test's own default) and ``test`` matter only to the
    procedures whose :attr:`Procedure.reads` name them."""

    kind: str  # PREDICT or CERTIFY
    n: int
    alpha: float
    sigma: float
    n0: int | None = None  # CERTIFY only
    sequential: bool = False
    radii: tuple[float, ...] | None = None  # None: the procedure's own (sequential: the summary table's steps)
    looks: tuple[int, ...] | None = None
    futility: str | None = None
    test: str = "exact"  # sequential CERTIFY's test: "exact" (group-sequential) or "bonferroni"
    grow: float | None = None  # the exact test's: draw on while the radius grows this much (z per 10,000 samples)
    name: str | None = None
    sound: bool = False  # --sound: counts of the exact rounded Gaussian on the inputs' grid (docs/sound.md)

    @property
    def key(self) -> str:
        """The key of the registered procedure this spec asks for."""
        if self.name is not None:
            return self.name
        return SEQUENTIAL if self.sequential and self.kind == CERTIFY else self.kind


class Procedure:
    """A :class:`ProcedureSpec` made concrete: ``Procedure(spec)`` is the registered procedure of ``spec.key``. A
    subclass sets the class attributes and, in ``__init__``, ``name`` (the ``procedure`` column and answer field),
    ``level`` (of its bound: alpha, or alpha / K), ``plan`` and ``decide``; it implements ``result`` and ``rules``."""

    key: ClassVar[str]  # what ProcedureSpec.name names it by
    kind: ClassVar[str]  # PREDICT or CERTIFY
    names: ClassVar[tuple[str, ...]]  # the names it gives (a trailing "..." stands for any ending)
    title: ClassVar[str]  # in words, for the settings a receipt records ("sequential CERTIFY")
    sequential: ClassVar[bool] = False  # it may stop an image at the plan's looks (a receipt says so)
    flag: ClassVar[str | None] = None  # the request's boolean field that asks for it (e.g. "sequential")
    reads: ClassVar[tuple[str, ...]] = ()  # ProcedureSpec fields beyond n, n0, alpha and sigma it depends on

    level: float
    plan: SamplingPlan
    decide: Decide | None = None

    def __new__(cls, spec: ProcedureSpec, *_: object, **__: object) -> Procedure:  # a subclass may take more
        chosen = registered(spec.key) if cls is Procedure else cls
        if chosen.kind != spec.kind:
            raise UserError(f"the procedure {chosen.key} is a {chosen.kind.upper()} procedure, not "
                            f"{spec.kind.upper()}")
        return object.__new__(chosen)

    def __init__(self, spec: ProcedureSpec) -> None:
        self.spec = spec

    def __getnewargs__(self) -> tuple[ProcedureSpec]:  # what copy and pickle pass to __new__
        return (self.spec,)

    @property
    def name(self) -> str:
        """The ``procedure`` column and answer field (what a subclass set, and " sound" under ``--sound``)."""
        return self._name + (SOUND_SUFFIX if self.spec.sound else "")

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    def result(self, counts: np.ndarray) -> Certificate | Prediction:
        """The decision from one image's class counts [len(plan.phases), classes]."""
        raise NotImplementedError

    def image_plans(self) -> Mapping[int, SamplingPlan | None] | None:
        """Images whose plan is not :attr:`plan` (by index; None: no samples); None: every image's is."""
        return None

    keeps = 0  # the classes of its first estimation samples that :meth:`image_result` reads (0: none)

    def image_result(self, index: int, counts: np.ndarray, kept: np.ndarray | None = None) -> Certificate | Prediction:
        """The decision for image ``index`` (:meth:`result`, unless the procedure decides by image); ``kept``: the
        classes of its first :attr:`keeps` estimation samples, where the procedure reads them."""
        return self.result(counts)

    def rules(self) -> RowRules:
        """What result rows of this procedure satisfy (checked on the rows a --resume keeps)."""
        raise NotImplementedError

    def max_radius(self) -> float | None:
        """The largest radius this procedure can certify; None: none (PREDICT) or not known."""
        return None

    def fields(self, result: Certificate | Prediction) -> dict[str, Any]:
        """The decision fields of one image's answer: every field of ``result``, in order, and :meth:`extra`."""
        return {**dataclasses.asdict(result), **self.extra(result)}

    def extra(self, result: Certificate | Prediction) -> dict[str, float]:
        """Fields of one image's result beyond ``result``'s own, named as the results file's extra columns
        (:attr:`columns`): none here."""
        return {}

    @property
    def columns(self) -> tuple[str, ...]:
        """The results file's columns after the kind's own: the keys of :meth:`extra`."""
        return ()

    def receipt(self) -> dict[str, Any]:
        """The sampling settings that, with the seed, an image's index and the classifier, give its counts
        (``sequential`` said outright: a sequential plan of one look has no looks)."""
        s, plan = self.spec, self.plan
        return {"procedure": self.name, "phases": [phase.name for phase in plan.phases], "sizes": list(plan.sizes),
                "looks": list(plan.looks), "n0": s.n0, "n": s.n, "alpha": s.alpha, "sigma": s.sigma,
                "sequential": self.sequential}

    def summary_radii(self, asked: tuple[float, ...] | None, default: tuple[float, ...]) -> tuple[float, ...]:
        """The radii a summary table of its results shows (``asked``: the run's ``--radii``)."""
        return asked or default

    @classmethod
    def describe(cls, spec: ProcedureSpec) -> str:
        """The settings in words ("CERTIFY with n0 20, n 100, alpha 0.001, sigma 0.25")."""
        sound = " (--sound)" if spec.sound else ""
        if spec.n0 is None:
            return f"{cls.title} with n {spec.n:,}, alpha {spec.alpha}{sound}"
        return f"{cls.title} with n0 {spec.n0:,}, n {spec.n:,}, alpha {spec.alpha}, sigma {spec.sigma}{sound}"

    @classmethod
    def receipt_spec(cls, name: str, n: int, alpha: float, sigma: float, n0: int | None) -> ProcedureSpec:
        """The spec a receipt of this procedure records (``name``: the receipt's procedure)."""
        return ProcedureSpec(cls.kind, n, alpha, sigma, n0, name=cls.key, sound=name.endswith(SOUND_SUFFIX))

    @classmethod
    def gives(cls, name: object) -> bool:
        """Whether ``name`` is one of the names this procedure gives (under ``--sound`` too)."""
        if not isinstance(name, str):
            return False
        name = name.removesuffix(SOUND_SUFFIX)
        return any(name == given or (given.endswith("...") and name.startswith(given[:-3])) for given in cls.names)


PROCEDURES: dict[str, type[Procedure]] = {}  # the registry: key -> procedure class
P = TypeVar("P", bound=type[Procedure])


def register(procedure: P) -> P:
    """Register a procedure class under its ``key`` (a class decorator; a later one of a key replaces it)."""
    PROCEDURES[procedure.key] = procedure
    return procedure


def registered(key: str) -> type[Procedure]:
    """The procedure registered under ``key`` (UserError naming the registered ones if none)."""
    if key not in PROCEDURES:
        raise UserError(f"no procedure named {key} is registered (registered: {', '.join(PROCEDURES)})")
    return PROCEDURES[key]
