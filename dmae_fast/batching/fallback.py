"""A fast body is used only once it has run and agreed with the plain body: the fallback chain.

A :class:`BodyChain` builds the candidate bodies, fastest first, and runs each on a trial batch of ``TRIAL_ROWS``
random images beside the plain body (the reference, with the torch-op noise, itself used unchecked). A body is kept
when it builds, runs and agrees with the reference on at least ``AGREEMENT[precision]`` of the rows: enough to
detect a broken body, not rounding. Otherwise one line says what failed and the next simpler body is tried; a body
built from model-cache entries is first rebuilt from scratch, the entries dropped, and a body that fails mid-run is
replaced the same way (:meth:`BodyChain.replace`). User errors and interrupts are raised, not fallen back from.
Every notice is printed and kept in :attr:`BodyChain.notices` (``body_fallbacks``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dmae_fast.base.disk_cache import drop_entries
from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line, print_notice
from dmae_fast.batching.scheduler import BatchBody
from dmae_fast.engines.base import Engine

AGREEMENT = {"fp32": 0.95, "fp16": 0.9, "bf16": 0.9, "fp8": 0.9}  # the share of trial rows that must agree
TRIAL_ROWS = {"cuda": 64, "cpu": 16}  # per device type: a trial batch costs little next to a run
TRIAL_INDEX = 0xD0FA11  # image index of the trial rows' noise (any index inside the contract)
PLAIN = "the plain body"


@dataclass(frozen=True)
class Candidate:
    """A body to try: its name for the notices, how to build it, and the model-cache entries its
    latest build read (the build appends them; see :class:`~dmae_fast.base.disk_cache.DiskCache`)."""

    name: str
    build: Callable[[], BatchBody]
    cache_reads: list[Path] = field(default_factory=list)


def trial_classes(body: BatchBody, engine: Engine, rows: int) -> torch.Tensor:
    """The class ``body`` predicts for each trial row ([rows] int64, on the host)."""
    device = engine.device
    counts = body.allocate(rows, torch.tensor([1], device=device))
    generator = torch.Generator().manual_seed(TRIAL_INDEX)
    try:
        for slot in range(rows):
            body.load(slot, torch.rand(engine.spec.input_shape, generator=generator).to(device))
        row = torch.arange(rows, device=device)
        body.run(row, row + TRIAL_INDEX, torch.zeros_like(row), row)
        return counts[:, 0].cpu().argmax(dim=1)
    finally:
        body.finish()


class BodyChain:
    """The bodies a run may use, fastest first, then ``last`` (the plain body, built unchecked). ``body`` is the one
    in use; ``notices`` what was passed over and why. A body handed out carries ``chain`` and ``fallbacks``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.notices: list[str] = []
        self.candidates: list[Candidate] = []
        self.position = 0  # the body in use: candidates[position], or the last one
        self._reference: torch.Tensor | None = None  # the reference's trial classes, once computed

    def notice(self, message: str) -> None:
        """Say ``message`` in one line and keep it in :attr:`notices`."""
        self.notices.append(message)
        print_notice(message)

    def choose(self, candidates: list[Candidate], last: Callable[[], BatchBody],
               reference: BatchBody | None) -> BatchBody:
        """The first of ``candidates`` that builds, runs and agrees with ``reference`` on a trial batch, or last()."""
        self.candidates, self._last, self._reference_body = candidates, last, reference
        return self._first_working(0)

    def replace(self, error: Exception) -> BatchBody:
        """The body after :attr:`body`, which failed mid-run with ``error`` (said in one line); UserError if last."""
        failed = self._name(self.position)
        if self.position == len(self.candidates):
            raise UserError(f"{failed} failed mid-run ({one_line(error, typed=True)}); no simpler body to continue on")
        why = one_line(error, typed=True)
        self.notice(f"{failed} failed mid-run ({why}); continuing on {self._name(self.position + 1)}")
        return self._first_working(self.position + 1)

    def _name(self, position: int) -> str:
        return self.candidates[position].name if position < len(self.candidates) else PLAIN

    def _first_working(self, start: int) -> BatchBody:
        for position in range(start, len(self.candidates)):
            candidate = self.candidates[position]
            body, problem = self._tried(candidate)
            if problem is not None and candidate.cache_reads:
                noun = "entry" if len(candidate.cache_reads) == 1 else "entries"
                named = " and ".join(str(path) for path in candidate.cache_reads)
                drop_entries(candidate.cache_reads)
                self.notice(f"{candidate.name}, built from the model cache {noun} {named}, {problem}; dropped the "
                            f"{noun}, building it again from scratch")
                body, problem = self._tried(candidate)
            if problem is None:
                return self._use(position, body)
            self.notice(f"{candidate.name} {problem}; continuing on {self._name(position + 1)}")
        return self._use(len(self.candidates), self._last())

    def _tried(self, candidate: Candidate) -> tuple[BatchBody | None, str | None]:
        """(``candidate`` built, None) if it runs and agrees with the reference, else (None, what failed)."""
        rows = TRIAL_ROWS.get(self.engine.device.type, TRIAL_ROWS["cuda"])
        needed = AGREEMENT.get(self.engine.precision, AGREEMENT["fp16"])
        candidate.cache_reads.clear()
        try:
            body = candidate.build()
            if self._reference is None:
                self._reference = trial_classes(self._reference_body, self.engine, rows)
            agreed = float((trial_classes(body, self.engine, rows) == self._reference).float().mean())
        except UserError:
            raise
        except Exception as error:  # any stage: build, compile, capture, load, run (interrupts are BaseExceptions)
            return None, f"failed ({one_line(error, typed=True)})"
        if agreed < needed:
            return None, (f"disagreed with the plain body on {1 - agreed:.0%} of a trial batch's rows "
                          f"(at most {1 - needed:.0%} allowed)")
        return body, None

    def _use(self, position: int, body: BatchBody) -> BatchBody:
        self.position, self.body = position, body
        body.chain, body.fallbacks = self, self.notices
        return body
