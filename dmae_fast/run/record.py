"""What a run reports: the run record ``<out>.json``, the rows as images finish, the progress
bar, and the result of the call."""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction

import torch
from tqdm import tqdm

from dmae_fast import __version__
from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.batching.bodies import ResolvedBody
from dmae_fast.batching.stream import ImageCounts
from dmae_fast.results.format import Mode
from dmae_fast.results.votes import VotesWriter
from dmae_fast.results.writer import CertifyRow, PredictRow, ResultsWriter, Row
from dmae_fast.run.config import CertifyConfig
from dmae_fast.run.host import device_name
from dmae_fast.run.opened import OpenedRun
from dmae_fast.run.output import record_path
from dmae_fast.stats.decisions import Certificate
from dmae_fast.stats.procedure import Procedure
from dmae_fast.stats.rounded_gaussian import guarantee, rounded_up, sound_table


class RunRecord:
    """The run record ``<out>.json``: the resolved settings, engine, threads, versions, status."""

    def __init__(self, opened: OpenedRun, body: ResolvedBody, mode: Mode, model_sha256: str,
                 extra: dict | None = None) -> None:
        self.opened, self.resolved, self.mode, self.extra = opened, body, mode, extra or {}
        self.model_sha256 = model_sha256  # names the very file that was certified

    def write(self, summary: dict, final: bool = False) -> None:
        """Write the record; an --overwrite run's old record stays until the new results replace it."""
        if self.mode == "overwrite" and not final:
            return
        opened, procedure, resolved = self.opened, self.opened.procedure, self.resolved
        body = resolved.current  # a body that failed mid-run was replaced
        record = {
            "config": opened.config.recorded(),
            "procedure": procedure.name,
            "max_radius": procedure.max_radius(),  # what the summary tables stop at
            "plan": {"phases": [p.name for p in procedure.plan.phases], "sizes": procedure.plan.sizes,
                     "looks": procedure.plan.looks},
            "engine": body.description,
            "body": resolved.record(),  # the body that ran ("fast" or "plain") and why
            "body_fallbacks": getattr(body, "fallbacks", []),
            "sound": sound_record(opened),  # --sound: the grid, the noise table's cost, the failure probability
            "model_sha256": self.model_sha256,
            **({"reference": opened.reference.summary()} if opened.reference is not None else {}),
            "threads": {"torch_intra_op": torch.get_num_threads(), "dataloader_workers": opened.workers,
                        "body_workers": getattr(body, "workers", None)},
            "classifier": opened.engine.spec.to_json_dict(),
            "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()},
            "device_name": device_name(opened.engine.device),
            "host_allocator": keep_freed_memory() if opened.engine.device.type == "cpu" else "unchanged",
            **self.extra,
            **summary,
        }
        record_path(opened.config).write_text(json.dumps(record, indent=2, default=str) + "\n")

def sound_record(opened: OpenedRun) -> dict | None:
    """A ``--sound`` run's grid and guarantee (:func:`~dmae_fast.stats.rounded_gaussian.guarantee`, for the most
    samples an image draws); None without. An incremental run's failure probability also adds the reference's alpha
    and the total variation of the reference's noise (its bound is on that noise)."""
    sound, procedure = opened.config.sound, opened.config.procedure
    if sound is None:
        return None
    table, elements = sound_table(procedure.sigma, sound.grid), math.prod(opened.engine.spec.input_shape)
    plans = [plan for plan in (opened.procedure.image_plans() or {}).values() if plan is not None]
    samples = max([opened.procedure.plan.total, *(plan.total for plan in plans)])
    stated = {**guarantee(table, samples, elements, procedure.alpha), "quantize": sound.quantize,
              "alpha": procedure.alpha}
    if opened.reference is not None:
        terms = opened.reference.sound_terms(elements)
        stated.update(terms, failure_probability=rounded_up(Fraction(stated["failure_probability"]) + sum(
            map(Fraction, terms.values()))))
    return stated


def progress_bar(config: CertifyConfig, total: int, enabled: bool = True) -> tqdm:
    return tqdm(total=total, unit="img", desc="certifying" if not config.procedure.predict else "predicting",
                disable=not (config.output.progress and enabled), mininterval=0.5, file=sys.stderr)

def show_progress(bar: tqdm, images: int, samples: int, elapsed: float) -> None:
    """Set the bar to ``images`` done at ``samples / elapsed`` noisy samples/s."""
    bar.update(images - bar.n)
    if elapsed > 0:
        bar.set_postfix_str(f"{samples / elapsed:,.0f} samples/s")

@dataclass
class RowWriter:
    """Turns finished images into rows: written to ``writer`` (if any; the votes of each, with ``--keep-votes``, to
    ``votes`` first), passed to ``on_row``, counted; ``after(samples)`` runs after each (progress, job-wide
    bookkeeping)."""

    opened: OpenedRun
    writer: ResultsWriter | None
    on_row: Callable[[Row], None]
    after: Callable[[int], None]
    votes: VotesWriter | None = None
    images: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def consume(self, results: Iterator[ImageCounts]) -> None:
        for done in results:
            self.images += 1
            samples = int(done.counts.sum())
            self.samples += samples
            row = result_row(self.opened.procedure, done, self.elapsed / self.images)  # the image's share
            if self.votes is not None:  # before its row: every row on disk has its votes
                assert done.kept is not None, "a run that keeps votes keeps the classes"
                self.votes.write(done.index, done.kept[:self.votes.samples] == row.predict)
            if self.writer is not None:
                self.writer.write(row)
            self.on_row(row)
            self.after(samples)

    def figures(self) -> dict:
        elapsed = self.elapsed
        return {"images": self.images, "samples": self.samples, "elapsed_s": round(elapsed, 3),
                "samples_per_s": round(self.samples / elapsed, 1) if elapsed > 0 else None}

def result_row(procedure: Procedure, done: ImageCounts, seconds: float) -> Row:
    """The TSV row of one finished image: its procedure's result, rendered."""
    result, sigma = procedure.image_result(done.index, done.counts, done.kept), procedure.spec.sigma
    correct = int(result.prediction == done.label)
    if isinstance(result, Certificate):
        return CertifyRow(done.index, done.label, result.prediction, result.radius, correct, seconds, result.n0,
                          result.n, result.n_a, result.p_a_lower, sigma, procedure.name, **procedure.extra(result))
    return PredictRow(done.index, done.label, result.prediction, correct, seconds, result.n, result.count1,
                      result.count2, result.pvalue, sigma)


@dataclass(frozen=True)
class RunResult:
    """What a completed run did; ``config`` is resolved (sigma and precision as used). In a
    multi-process run, rank 0's result counts the whole job (``primary``), the others' their own."""

    config: CertifyConfig
    images: int
    samples: int
    elapsed_s: float
    samples_per_s: float
    world_size: int = 1
    primary: bool = True
