"""A fast body is used only once it has run and agreed with the plain body: the fallback chain.

:func:`~dmae_fast.certification.bodies.batch_body` lists the bodies that could run a
certification, fastest first (e.g. fused + compiled + CUDA graphs, then without the graphs,
without the compile, unfused), and :func:`first_working` builds each in turn and runs it on a
trial batch: ``TRIAL_ROWS`` rows, each a different random image (a slot of its own), so every
row's predicted class is visible in the counts. The plain body (the reference, with the torch-op
noise) runs the same rows. A body is kept when it builds and runs (Triton compiles, torch.compile
compiles, the CUDA graph captures, the runtime session loads) and its classes agree with the plain
body's on at least ``AGREEMENT[precision]`` of the rows; otherwise one line says what failed and
the next simpler body is tried. The plain body itself is used unchecked: it is the reference.

The agreement asked for detects a broken body (a wrong kernel, layout or weights disagree on
most rows), not rounding: fp16 bodies on cast weights flip ~1% of a random-weight ViT's votes
against the plain body's autocast, which is the classifier as executed, not a fault.
Errors in the user's input (:class:`~dmae_fast.errors.UserError`) are raised, not fallen back from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dmae_fast.certification.scheduler import BatchBody
from dmae_fast.engines.base import Engine
from dmae_fast.errors import Interrupted, UserError

AGREEMENT = {"fp32": 0.95, "fp16": 0.9, "bf16": 0.9, "fp8": 0.9}  # the share of trial rows that must agree
TRIAL_ROWS = {"cuda": 64, "cpu": 16}  # per device type: a trial batch costs little next to a run
TRIAL_INDEX = 0xD0FA11  # image index of the trial rows' noise (any index inside the contract)


@dataclass(frozen=True)
class Candidate:
    """A body to try: its name for the notices, and how to build it."""

    name: str
    build: Callable[[], BatchBody]


def _one_line(error: BaseException) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= 200 else text[:197] + "..."


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


def first_working(candidates: list[Candidate], plain: BatchBody, engine: Engine,
                  notice: Callable[[str], None]) -> tuple[BatchBody | None, list[str]]:
    """(the first candidate that builds, runs and agrees with ``plain`` on a trial batch, else
    None: the caller runs the plain body; the one-line notices of those that did not, in order)."""
    rows = TRIAL_ROWS.get(engine.device.type, TRIAL_ROWS["cuda"])
    needed = AGREEMENT.get(engine.precision, AGREEMENT["fp16"])
    reference: torch.Tensor | None = None
    fallbacks: list[str] = []
    for position, candidate in enumerate(candidates):
        try:
            body = candidate.build()
            if reference is None:
                reference = trial_classes(plain, engine, rows)
            agreed = float((trial_classes(body, engine, rows) == reference).float().mean())
            problem = None if agreed >= needed else (f"disagreed with the plain body on {1 - agreed:.0%} of a trial "
                                                     f"batch's rows (at most {1 - needed:.0%} allowed)")
        except (UserError, Interrupted, KeyboardInterrupt):
            raise
        except Exception as error:  # any stage: build, compile, capture, load, run
            problem = f"failed ({_one_line(error)})"
        if problem is None:
            return body, fallbacks
        following = candidates[position + 1].name if position + 1 < len(candidates) else "the plain body"
        fallbacks.append(f"{candidate.name} {problem}; continuing on {following}")
        notice(fallbacks[-1])
    return None, fallbacks
