"""Replay a server's answer offline from its receipt: the receipt's proof (``dmae-serve replay``, docs/serving.md).

:func:`replay_answer` rebuilds the procedure from the receipt's settings and checks that it is the one recorded,
re-runs every image with the offline :class:`~dmae_fast.batching.stream.StreamingCertifier` (at any batch size),
recomputes every decision field from the served counts (and a ``--sound`` answer's guarantee from its settings),
and names each field that differs. A missing, mistyped or out-of-range field is a UserError."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import file_sha256, is_sha256
from dmae_fast.batching.bodies import resolve_body
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.engines.base import Engine
from dmae_fast.model.config import sigma_problem
from dmae_fast.noise.sound_options import Sound
from dmae_fast.serve.differences import (
    counts_difference,
    describe,
    field_differences,
    fit_problem,
    receipt_differences,
    text,
)
from dmae_fast.serve.payloads import PayloadError, served_images
from dmae_fast.serve.service import input_sha256, json_result, sound_guarantee, sound_receipt
from dmae_fast.stats.plan import Phase
from dmae_fast.stats.procedure import PREDICT, PROCEDURES, Procedure, ProcedureSpec, registered
from dmae_fast.stats.rounded_gaussian import table_problem

ANSWER_FIELDS = ("procedure", "results", "receipt")
SOUND_FIELDS = ("sound_quantize", "certified_image", "tv_per_image", "failure_probability")  # besides sound_grid


@dataclass(frozen=True)
class Receipt:
    """A receipt's fields, of the right types and in range; ``spec``: the settings they record."""

    procedure: str
    plan: SamplingPlan
    spec: ProcedureSpec
    n0: int | None  # as recorded (``spec.n0`` is None for PREDICT whatever the receipt says)
    sequential: bool | None  # as recorded; None in receipts written before it was
    seed: int
    model_sha256: str | None
    indices: tuple[int, ...]
    sound: Sound | None = None  # a --sound server's grid and --quantize (its procedure's name ends with " sound")


@dataclass(frozen=True)
class Result:
    """One result of an answer: its image index, its counts and every field it states."""

    index: int
    counts: np.ndarray  # [phases of the plan, classes] as served
    fields: dict  # the result as served


@dataclass(frozen=True)
class Answer:
    """A dmae-serve answer whose fields have the right types and ranges (not yet compared)."""

    document: dict
    receipt: Receipt
    results: tuple[Result, ...]


def _field(document: dict, key: str, where: str) -> object:
    if key not in document:
        raise UserError(f"not a dmae-serve answer: {where} has no '{key}'")
    return document[key]


def _whole(value: object, where: str, low: int, bits: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**bits:
        raise UserError(f"{where} must be a whole number in [{low}, 2**{bits}), got {text(value)}")
    return value


def _list(value: object, where: str) -> list:
    if not isinstance(value, list):
        raise UserError(f"{where} must be a list, got {text(value)}")
    return value


def _whole_field(receipt: dict, key: str, low: int, bits: int) -> int:
    return _whole(_field(receipt, key, "the receipt"), f"the receipt's {key}", low, bits)


def _whole_list(receipt: dict, key: str, low: int) -> list[int]:
    where = f"the receipt's {key}"
    return [_whole(value, where, low, 32) for value in _list(_field(receipt, key, "the receipt"), where)]


def plan_of(receipt: dict) -> SamplingPlan:
    """The sampling plan a receipt records (phases, sizes, looks)."""
    names = _list(_field(receipt, "phases", "the receipt"), "the receipt's phases")
    for name in names:
        if name not in Phase.__members__:
            raise UserError(f"the receipt's phases must be phases of the noise contract "
                            f"({', '.join(Phase.__members__)}), got {text(name)}")
    sizes, looks = _whole_list(receipt, "sizes", 1), _whole_list(receipt, "looks", 1)
    if not names or len(sizes) != len(names):
        raise UserError(f"the receipt records {len(names)} phases and {len(sizes)} sizes; it needs one size a phase")
    return SamplingPlan(tuple(Phase[name] for name in names), tuple(sizes), tuple(looks))


def _of_receipt(name: object, sequential: bool | None) -> type[Procedure] | None:
    """The procedure whose settings a receipt records: the one that gives its ``name``, or, where the
    receipt's ``sequential`` says otherwise, the first of its kind that does (None: no name matches)."""
    named = next((p for p in PROCEDURES.values() if p.gives(name)), None)
    if named is None or sequential is None or sequential == named.sequential:
        return named
    return next((p for p in PROCEDURES.values() if p.kind == named.kind and p.sequential == sequential), named)


def read_receipt(receipt: object) -> Receipt:
    """A receipt's fields, checked for type and range (UserError naming the first that is not)."""
    if not isinstance(receipt, dict):
        raise UserError("not a dmae-serve answer: it needs a 'receipt' object")
    name = _field(receipt, "procedure", "the receipt")
    plan = plan_of(receipt)
    sequential = receipt.get("sequential")
    if sequential is not None and not isinstance(sequential, bool):
        raise UserError(f"the receipt's sequential must be true or false, got {text(sequential)}")
    procedure = _of_receipt(name, sequential)  # receipts written before "sequential" say it with their name
    if procedure is None:
        names = ", ".join(given for p in PROCEDURES.values() for given in p.names)
        raise UserError(f"the receipt's procedure must be one dmae-serve runs ({names}), got {text(name)}")
    kind = procedure.kind
    n = _whole_field(receipt, "n", 1, 32)
    n0 = _field(receipt, "n0", "the receipt")
    if not (n0 is None and kind == PREDICT):
        n0 = _whole(n0, "the receipt's n0", 1, 32)
    alpha = _field(receipt, "alpha", "the receipt")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise UserError(f"the receipt's alpha must be a number in (0, 1), got {text(alpha)}")
    sigma = _field(receipt, "sigma", "the receipt")
    if sigma_problem(sigma):
        raise UserError(f"the receipt's {sigma_problem(sigma)}")
    seed = _whole_field(receipt, "seed", 0, 64)
    model = _field(receipt, "model_sha256", "the receipt")
    if model is not None and not is_sha256(model):
        raise UserError(f"the receipt's model_sha256 must be 64 hex digits or null, got {text(model)}")
    indices = _whole_list(receipt, "indices", 0)
    spec = procedure.receipt_spec(str(name), n, float(alpha), float(sigma), None if kind == PREDICT else n0)
    grid = receipt.get("sound_grid")
    if spec.sound != (grid is not None):
        raise UserError(f"the receipt's procedure {text(name)} and its sound_grid {text(grid)} disagree: a --sound "
                        "answer records both, any other neither")
    if grid is not None:
        grid = _whole(grid, "the receipt's sound_grid", 1, 16)
        problem = table_problem(spec.sigma, grid)
        if problem is not None:
            raise UserError(f"the receipt's {problem}")
    quantize = receipt.get("sound_quantize", False) if grid is not None else False
    if not isinstance(quantize, bool):
        raise UserError(f"the receipt's sound_quantize must be true or false, got {text(quantize)}")
    sound = None if grid is None else Sound(grid, quantize)
    return Receipt(str(name), plan, spec, n0, sequential, seed, model, tuple(indices), sound)


def _counts(value: object, where: str, plan: SamplingPlan) -> np.ndarray:
    names = [phase.name.lower() for phase in plan.phases]
    if not isinstance(value, dict):
        raise UserError(f"{where} must be an object of class counts for each phase ({', '.join(names)}), "
                        f"got {text(value)}")
    for key in value:
        if key not in names:
            raise UserError(f"{where} has '{key}', which is not a phase of the receipt's plan ({', '.join(names)})")
    rows = []
    for name in names:
        row = _list(_field(value, name, where), f"{where}.{name}")
        rows.append([_whole(count, f"{where}.{name}'s counts", 0, 32) for count in row])
    if len({len(row) for row in rows}) != 1 or not rows[0]:
        raise UserError(f"{where} must count the same classes (at least one) in every phase")
    return np.array(rows, dtype=np.int64)


def read_answer(document: object) -> Answer:
    """A dmae-serve answer, every field that the replay reads checked for type and range."""
    if not isinstance(document, dict):
        raise UserError("not a dmae-serve answer: it must be a JSON object")
    receipt = read_receipt(document.get("receipt"))
    listed = document.get("results")
    if not isinstance(listed, list) or not listed:
        raise UserError("not a dmae-serve answer: it needs 'results', a non-empty list")
    results = []
    for i, result in enumerate(listed):
        where = f"results[{i}]"
        if not isinstance(result, dict):
            raise UserError(f"{where} must be an object, got {text(result)}")
        index = _whole(_field(result, "index", where), f"{where}.index", 0, 32)
        results.append(Result(index, _counts(_field(result, "counts", where), f"{where}.counts", receipt.plan),
                              result))
    return Answer(document, receipt, tuple(results))


def settings(spec: ProcedureSpec) -> str:
    """The settings a receipt records, in words ("CERTIFY with n0 20, n 100, alpha 0.001, sigma 0.25")."""
    return registered(spec.key).describe(spec)


def _contradictions(receipt: Receipt, procedure: Procedure) -> list[str]:
    """Where the receipt records another procedure or plan than its settings give (``procedure``)."""
    rebuilt, give = procedure.receipt(), f"its settings ({settings(procedure.spec)}) give"
    out = []
    if receipt.procedure != procedure.name:
        out.append(f"receipt procedure served {receipt.procedure}, but {give} {procedure.name}")
    if receipt.plan != procedure.plan:
        out.append(f"receipt plan served {describe(receipt.plan)}, but {give} {describe(procedure.plan)}")
    for key, recorded in (("n0", receipt.n0), ("sequential", receipt.sequential)):
        if recorded is not None and recorded != rebuilt[key]:
            out.append(f"receipt {key} served {text(recorded)}, but {give} {text(rebuilt[key])}")
    return out


@dataclass(frozen=True)
class Replayed:
    """One result replayed; ``differences`` in words ("radius served 0.75, recomputed 0.5"), empty if none."""

    index: int
    differences: tuple[str, ...]


@dataclass(frozen=True)
class Replay:
    """A whole answer replayed: ``differences`` of the answer and its receipt, then each result."""

    differences: tuple[str, ...]
    results: tuple[Replayed, ...]  # empty when the receipt contradicts itself (no plan to re-run)

    @property
    def identical(self) -> bool:
        return not self.differences and not any(r.differences for r in self.results)


def _rerun(procedure: Procedure, smoothing: Smoothing, items: Iterable[tuple[int, torch.Tensor, int]],
           options: BodyOptions) -> dict[int, np.ndarray]:
    """The offline counts of ``(index, image, key)`` items, by key, on the body ``options`` ask for."""
    streamer = StreamingCertifier(smoothing, procedure.plan, resolve_body(smoothing, options).body)
    return {done.label: done.counts for done in streamer.run(items, procedure.decide)}


def replay_answer(answer: Answer | dict, images: list[torch.Tensor], engine: Engine, batch: int = 1000,
                  options: BodyOptions = BodyOptions(), model_file: str | Path | None = None) -> Replay:
    """Re-run and check every result of a server answer (``images`` in its results' order) on the body ``options``
    ask for; ``model_file``: the file ``engine`` was opened from, whose SHA-256 must be the receipt's (None: any)."""
    answer = answer if isinstance(answer, Answer) else read_answer(answer)
    receipt, results = answer.receipt, answer.results
    if len(images) != len(results):
        raise UserError(f"the answer has {len(results)} results but {len(images)} images were given")
    procedure = Procedure(receipt.spec)
    differences = [f"the answer states '{key}', which dmae-serve answers do not have"
                   for key in sorted(set(answer.document) - set(ANSWER_FIELDS))]
    if answer.document.get("procedure") != procedure.name:
        differences.append(f"procedure served {text(answer.document.get('procedure'))}, recomputed "
                           f"{text(procedure.name)}")
    if model_file is not None:
        local = file_sha256(model_file) if Path(model_file).is_file() else None
        if local != receipt.model_sha256:
            differences.append(f"receipt model_sha256 served {text(receipt.model_sha256, None)}, the model file's "
                               f"is {text(local, None)}")
    if list(receipt.indices) != [r.index for r in results]:
        differences.append(f"receipt indices served {text(list(receipt.indices))}, the results' are "
                           f"{text([r.index for r in results])}")
    problems = _contradictions(receipt, procedure)
    if problems:
        return Replay(tuple(differences + problems), ())
    elements = math.prod(engine.spec.input_shape)
    sound = receipt.sound  # the receipt's noise and rounding, not the caller's
    expected = {} if sound is None else sound_receipt(procedure, sound, elements)
    differences += receipt_differences(SOUND_FIELDS, answer.document["receipt"], expected, procedure.name)
    smoothed, rounded = _smoothed(images, sound)
    stated = {} if sound is None else sound_guarantee(procedure, sound.grid, elements)
    extras = [{**stated, **({} if changed is None else {"rounded": changed})}
              for changed in rounded or [None] * len(images)]
    fit = [fit_problem(procedure.plan, r.counts, engine.spec.num_classes) for r in results]
    items = [(r.index, image, key) for key, (r, image, problem) in enumerate(zip(results, smoothed, fit))
             if not problem]
    smoothing = Smoothing(engine, procedure.spec.sigma, receipt.seed, batch, sound)
    offline = _rerun(procedure, smoothing, items, options) if items else {}
    return Replay(tuple(differences), tuple(_compared(procedure, result, image, fit[key], offline.get(key),
                                                      engine.spec.class_names, extras[key])
                                            for key, (result, image) in enumerate(zip(results, smoothed))))


def _smoothed(images: list[torch.Tensor], sound: Sound | None) -> tuple[list[torch.Tensor], tuple[bool, ...] | None]:
    """What the server smoothed for the images given (:func:`served_images`; UserError where it would refuse one)."""
    try:
        return served_images(images, sound)
    except PayloadError as refused:
        problem = refused.message.replace("the request", "the images given").split(";")[0]
        raise UserError(f"{problem}; the server refuses such an image, so the answer is not for it") from None


def _compared(procedure: Procedure, result: Result, image: torch.Tensor, fit_problem: str | None,
              offline: np.ndarray | None, class_names: tuple[str, ...] | None, extra: dict) -> Replayed:
    """One result against its replay: its input, its counts and each decision field (from the served counts;
    ``extra``: the fields a --sound answer adds to them)."""
    found, given, served = [], input_sha256(image), result.fields.get("input_sha256")
    if given != served:
        found.append(f"input differs from the one served (input_sha256 served {text(served, 70)}, the image "
                     f"given {given})")
    if fit_problem is not None:
        return Replayed(result.index, (*found, fit_problem))
    if not np.array_equal(result.counts, offline):
        found.append(counts_difference(procedure.plan, result.counts, offline))
    found += field_differences(procedure.name, result.fields,
                                {**json_result(procedure, result.counts, class_names), **extra})
    return Replayed(result.index, tuple(found))
