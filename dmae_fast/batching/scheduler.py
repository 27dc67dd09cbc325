"""The one scheduler: the noisy samples of many images packed into full batches, counts on the device.

Each image (a :class:`Job`) brings its own :class:`~dmae_fast.stats.plan.SamplingPlan` and, for
sequential CERTIFY, a stopping rule consulted at the plan's looks. The rows of the images on the device
are laid end to end, oldest image first, and cut into batches of ``batch`` rows, so no batch runs half
empty while rows are waiting. A row is (slot, image index, phase, sample index): the slot holds the clean
image, the noise is the contract's pure function of the rest, and the predicted class is added to
``counts[slot, phase, class]`` on the device. The host knows from the schedule alone when an image's
stage ends; it then copies that image's counts back asynchronously, so nothing waits for the device per
batch. An image that finishes, stops early or is cancelled frees its slot for the next.

The counts do not depend on the packing, so under a :class:`RowSplit` (``--shard samples``) each
process runs the same schedule, counts its share of each batch's rows, and sums the counts at a stage
end before anything is decided. :class:`SlotScheduler` is driven only through
:class:`~dmae_fast.batching.engine_loop.EngineLoop`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dmae_fast.stats.decisions import finite_counts
from dmae_fast.stats.plan import Decide, Phase, SamplingPlan

PHASES = (Phase.SELECTION, Phase.ESTIMATION, Phase.PREDICTION)  # a phase's position in the counts = its value
Segment = tuple[int, int, int, int, int]  # consecutive rows: (slot, image index, phase, first sample, count)


def phase_ids(device: torch.device) -> torch.Tensor:
    """The phases of the counts buffer, in position order (a phase's position is its value)."""
    return torch.tensor([int(phase) for phase in PHASES], device=device)


class BatchBody(Protocol):
    """What the scheduler needs to run batches (:class:`~.stream.ImageBatches` or a fast body)."""

    description: str

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        """Per-run buffers; returns the counts [slots, len(phase_ids), classes + 1] the scheduler reads
        (``phase_ids[position]``: the phase counted at that position; :func:`phase_ids` for a run)."""

    def load(self, slot: int, image: torch.Tensor) -> None: ...

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        """Noise, classify and count one batch of rows (device tensors), without synchronizing;
        ``position``: each row's phase as its position in the counts buffer."""

    def finish(self) -> None:
        """Called when a run ends (completed or not): undo run-wide settings."""


class Job:
    """One image to sample: its plan and stopping rule, its progress and its slot."""

    __slots__ = ("image", "plan", "decide", "index", "label", "row", "stage", "slot", "_starts", "_phases")

    def __init__(self, image: torch.Tensor, plan: SamplingPlan, decide: Decide | None = None, index: int = -1,
                 label: int = 0) -> None:
        self.image, self.plan, self.decide = image, plan, decide
        self.index, self.label = index, label
        self.row = self.stage = 0
        self.slot: int | None = None
        self._starts = np.cumsum((0,) + plan.sizes)
        self._phases = [int(phase) for phase in plan.phases]  # their rows in the counts buffer

    @property
    def stage_end(self) -> int:
        return self.plan.stage_ends[self.stage]

    @property
    def final(self) -> bool:
        return self.stage == len(self.plan.stage_ends) - 1

    def segments(self, take: int) -> list[Segment]:
        """Rows [row, row + take) of this image, split at its plan's phase boundaries."""
        out = []
        for phase, start, end in zip(self._phases, self._starts[:-1], self._starts[1:]):
            lo, hi = max(self.row, start), min(self.row + take, end)
            if lo < hi:
                out.append((self.slot, self.index, phase, int(lo - start), int(hi - lo)))
        return out

    def counts(self, slot_counts: np.ndarray) -> np.ndarray:
        """This image's rows of a slot's counts [3 phases, classes + 1], in plan order, the
        non-finite column checked and removed (raises UserError when a logit was not finite)."""
        return finite_counts(self.index, slot_counts[self._phases])


@dataclass(frozen=True)
class RowSplit:
    """How ``world`` processes share each batch: process ``rank`` counts the contiguous ``share`` of its
    rows; ``summed`` turns this process's counts of some slots [k, phases, classes + 1] into every
    process's sum, on the host (a collective: every process calls it at the same point of the schedule)."""

    rank: int
    world: int
    summed: Callable[[torch.Tensor], torch.Tensor]

    def share(self, rows: int) -> tuple[int, int]:
        """This process's rows [lo, hi) of a batch of ``rows`` (the shares' sizes differ by at most one)."""
        return rows * self.rank // self.world, rows * (self.rank + 1) // self.world


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` copied to ``device`` in stream order without waiting for the device (a plain copy
    from pageable memory synchronizes the stream, and so drains the batches queued on the GPU)."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def batch_rows(segments: list[Segment], device: torch.device,
               part: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
    """Runs of rows (slot, image index, phase position, first sample, count) -> the four per-row
    columns a batch body takes, on ``device`` (copied without blocking the host); only the rows
    [lo, hi) of ``part`` where given."""
    columns = torch.tensor([s[:4] for s in segments], dtype=torch.int64)
    lengths = torch.tensor([s[4] for s in segments])
    per_row = torch.repeat_interleave(columns, lengths, dim=0)
    per_row[:, 3] += torch.arange(len(per_row)) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    if part is not None:
        per_row = per_row[part[0]:part[1]]
    return to_device(per_row, device).unbind(1)


def counts_to_host(counts: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A copy of ``counts[slots]`` taken in stream order, on its way to the host: on CUDA a pinned
    tensor filled asynchronously and the event that marks it complete; on a CPU the copy itself."""
    snapshot = counts[to_device(torch.tensor(slots), counts.device)]  # advanced indexing copies
    if counts.device.type != "cuda":
        return snapshot, None
    host = torch.empty(snapshot.shape, dtype=snapshot.dtype, pin_memory=True)
    host.copy_(snapshot, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


class SlotScheduler:
    """Slots, packing, snapshots and decisions (see the module doc), driven only by the engine loop. Jobs
    come from :meth:`add`, then from ``source`` (called only when a slot is free and no image has rows
    left, so a dataset is read no further ahead than the device needs; None: it has no more)."""

    def __init__(self, body: BatchBody, device: torch.device, batch: int, num_slots: int,
                 source: Callable[[], Job | None] | None = None, split: RowSplit | None = None) -> None:
        self.body, self.device, self.batch, self.num_slots = body, device, batch, num_slots
        self._source, self._split = source, split
        self._free: deque[int] = deque(range(num_slots))
        self._pending: deque[Job] = deque()  # added, not on the device yet
        self._ready: deque[Job] = deque()  # on the device, with rows to issue in their current stage
        self._since: dict[Job, float] = {}  # pending and ready jobs: when their next rows became runnable
        self._waiting: deque[tuple[list[Job], torch.Tensor, torch.cuda.Event | None]] = deque()
        self._cancelled: set[Job] = set()  # cancelled while a snapshot of theirs is on its way
        self._finished: list[tuple[Job, object]] = []
        self._counts = body.allocate(num_slots, phase_ids(device))

    def add(self, job: Job, since: float) -> None:
        """Queue ``job``, whose rows are runnable since ``since`` (``time.monotonic()``)."""
        self._pending.append(job)
        self._since[job] = since

    def _next(self) -> Job | None:
        if self._pending:
            return self._pending.popleft()
        job = self._source() if self._source is not None else None
        if job is None:
            self._source = None
        return job

    def _load(self, job: Job) -> None:
        job.slot = self._free.popleft()
        self.body.load(job.slot, job.image)
        self._since.setdefault(job, time.monotonic())
        self._ready.append(job)

    def runnable(self) -> tuple[int, float]:
        """Rows the next batch could take now, and when the oldest of them became runnable."""
        rows, oldest = 0, math.inf
        for job in itertools.chain(self._ready, itertools.islice(self._pending, len(self._free))):
            rows += job.stage_end - job.row
            oldest = min(oldest, self._since[job])
            if rows >= self.batch:
                break
        return rows, oldest

    def pack(self, block: bool) -> tuple[list[Segment], list[Job]]:
        """The next batch's rows, oldest image first, and the images whose stage ends in it; the next job is
        loaded when no image has rows left and a slot is free. With ``block``, a batch short of images
        waits for the first pending snapshot (whose images may continue or free their slots)."""
        segments: list[Segment] = []
        reached: list[Job] = []
        room = self.batch
        while room:
            if not self._ready:
                job = self._next() if self._free else None
                if job is not None:
                    self._load(job)
                elif block and self._waiting:
                    self.resolve(wait=True, only_first=True)
                else:
                    break
                continue
            job = self._ready[0]
            take = min(room, job.stage_end - job.row)
            segments += job.segments(take)
            job.row += take
            room -= take
            if job.row == job.stage_end:
                reached.append(self._ready.popleft())
                del self._since[job]
        return segments, reached

    def issue(self, segments: list[Segment]) -> int:
        """Hand one batch's rows (this process's share) to the body, without synchronizing; the rows handed."""
        rows = sum(segment[4] for segment in segments)
        part = None if self._split is None else self._split.share(rows)
        if part is not None and part[0] == part[1]:
            return 0
        self.body.run(*batch_rows(segments, self.device, part))
        return rows if part is None else part[1] - part[0]

    def snapshot(self, reached: list[Job]) -> None:
        """Copy the counts of images at a stage end off the device (asynchronously on CUDA); images
        at their final stage free their slot at once (zeroed in stream order after the copy)."""
        if reached:
            slots = [job.slot for job in reached]
            if self._split is None:
                snapshot, event = counts_to_host(self._counts, slots)
            else:  # every process's sum, before anything is decided
                snapshot, event = self._split.summed(self._counts[to_device(torch.tensor(slots), self.device)]), None
            self._release([job for job in reached if job.final])
            self._waiting.append((reached, snapshot, event))

    def _release(self, jobs: list[Job]) -> None:
        slots = [job.slot for job in jobs if job.slot is not None]
        if slots:
            self._counts[to_device(torch.tensor(slots), self.device)] = 0
            self._free.extend(slots)
        for job in jobs:
            job.slot = None

    def resolve(self, wait: bool, only_first: bool = False) -> None:
        """Act on snapshots that reached the host (all of them with ``wait``): a job ends at its last
        stage, when its stopping rule says so, when cancelled, or on an error (non-finite logits);
        otherwise its next stage becomes runnable."""
        while self._waiting and (wait or self._waiting[0][2] is None or self._waiting[0][2].query()):
            reached, host, event = self._waiting.popleft()
            if event is not None:
                event.synchronize()
            stopped = []
            for job, slot_counts in zip(reached, host.numpy()):
                cancelled = job in self._cancelled
                try:
                    counts = None if cancelled else job.counts(slot_counts)
                    done = cancelled or job.final or job.decide(job.index, counts, job.stage)
                except Exception as error:  # noqa: BLE001 (this image only; the driver decides what it means)
                    counts, done = error, True
                if not done:
                    job.stage += 1
                    self._since[job] = time.monotonic()
                    self._ready.append(job)
                    continue
                if not job.final:
                    stopped.append(job)
                if cancelled:
                    self._cancelled.remove(job)
                else:
                    self._finished.append((job, counts))
            self._release(stopped)
            if only_first:
                return

    def drain(self) -> list[tuple[Job, object]]:
        """The jobs that ended since the last call: (job, counts | the exception that ended it)."""
        finished, self._finished = self._finished, []
        return finished

    def cancel(self, jobs: Collection[Job]) -> None:
        """Forget ``jobs`` (never reported as finished): queued ones or ones with rows left at once
        (their slots freed), ones with a snapshot on its way when it arrives; others are ignored."""
        gone = set(jobs)
        self._pending = deque(job for job in self._pending if job not in gone)
        dropped = [job for job in self._ready if job in gone]
        if dropped:
            self._ready = deque(job for job in self._ready if job not in gone)
            self._release(dropped)
        self._cancelled.update(job for reached, _, _ in self._waiting for job in reached if job in gone)
        for job in gone:
            self._since.pop(job, None)

    def reset(self, pending: bool = False) -> list[Job]:
        """Forget every job on the device, and with ``pending`` the queued ones too (after a failed
        batch, or when the driver stops): counts zeroed, slots freed; returns them (cancelled ones aside)."""
        jobs = list(self._ready) + [job for reached, _, _ in self._waiting for job in reached
                                    if job not in self._cancelled]
        for job in self._ready:
            del self._since[job]
        if pending:
            jobs = list(self._pending) + jobs
            self._pending.clear()
            self._since.clear()
        self._ready.clear()
        self._waiting.clear()
        self._cancelled.clear()
        self._counts.zero_()
        self._free = deque(range(self.num_slots))
        for job in jobs:
            job.slot = None
        return jobs

    @property
    def busy(self) -> bool:
        """Whether any job is queued or on the device, or the source may have more."""
        return bool(self._pending or self._ready or self._waiting or self._source is not None)
