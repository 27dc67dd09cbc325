"""The one scheduler: the noisy samples of many images packed into full batches, counts on the device.

Each image (a :class:`Job`) brings its own :class:`~dmae_fast.stats.plan.SamplingPlan`
(e.g. n0 selection then n estimation samples, or PREDICT's n) and, for sequential CERTIFY, a
stopping rule consulted at the plan's looks. The rows of the images on the device are laid end to
end, oldest image first, and cut into batches of ``batch`` rows, so a batch mixes the tail of one
image with the head of the next and never runs half empty while rows are waiting.

A row is (slot, image index, phase, sample index): the slot holds the clean image on the device,
the noise is the contract's pure function of (seed, image index, phase, sample index), and the
predicted class is added to ``counts[slot, phase, class]`` on the device (the counts buffer holds
all three phases, so PREDICT and CERTIFY images share batches). The host knows from the schedule
alone when an image's stage ends; it then takes a device-side snapshot of that image's counts and
copies it back asynchronously; nothing waits for the device per batch. An image that finishes, is
stopped early or is cancelled frees its slot for the next image.

Because the noise does not depend on how rows are packed, an image's counts are the same whatever
batch size or other images shared its batches. :class:`SlotScheduler` is driven by the offline
streamer (:class:`~dmae_fast.certification.stream.StreamingCertifier`, images from a dataset) and
by the server's device thread (:class:`~dmae_fast.serve.scheduler.Scheduler`, images from requests,
with a clock for partial batches).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from dmae_fast.stats.decisions import finite_counts
from dmae_fast.stats.plan import Decide, Phase, SamplingPlan

PHASES = (Phase.SELECTION, Phase.ESTIMATION, Phase.PREDICTION)  # a phase's position in the counts = its value
Segment = tuple[int, int, int, int, int]  # consecutive rows: (slot, image index, phase, first sample, count)


class BatchBody(Protocol):
    """What the scheduler needs to run batches (:class:`~.stream.ImageBatches` or a fast body)."""

    description: str

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        """Per-run buffers; returns the counts [slots, phases, classes + 1] the scheduler reads."""

    def load(self, slot: int, image: torch.Tensor) -> None: ...

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        """Noise, classify and count one batch of rows (device tensors), without synchronizing."""

    def finish(self) -> None:
        """Called when a run ends (completed or not): undo run-wide settings."""


class Job:
    """One image to sample: its plan and stopping rule, its progress, its slot, where its answer goes."""

    __slots__ = ("image", "plan", "decide", "done", "index", "label", "row", "stage", "slot", "since", "cancelled",
                 "queued", "_starts", "_phases")

    def __init__(self, image: torch.Tensor, plan: SamplingPlan, decide: Decide | None = None,
                 done: Callable[[object], None] | None = None, index: int = -1, label: int = 0) -> None:
        self.image, self.plan, self.decide, self.done = image, plan, decide, done
        self.index, self.label = index, label
        self.row = self.stage = 0
        self.slot: int | None = None
        self.since = 0.0  # when its next rows became runnable (time.monotonic; the server's clock)
        self.cancelled = False
        self.queued = False  # counted against the server's queue bound (under its lock)
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


def batch_rows(segments: list[Segment], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Runs of rows (slot, image index, phase position, first sample, count) -> the four per-row
    columns a batch body takes, on ``device`` (copied without blocking the host)."""
    columns = torch.tensor([s[:4] for s in segments], dtype=torch.int64)
    lengths = torch.tensor([s[4] for s in segments])
    per_row = torch.repeat_interleave(columns, lengths, dim=0)
    per_row[:, 3] += torch.arange(len(per_row)) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    if device.type == "cuda":
        per_row = per_row.pin_memory()
    return per_row.to(device, non_blocking=True).unbind(1)


def counts_to_host(counts: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """A copy of ``counts[slots]`` taken in stream order, on its way to the host: on CUDA a pinned
    tensor filled asynchronously and the event that marks it complete; on a CPU the copy itself."""
    snapshot = counts[torch.tensor(slots, device=counts.device)]  # advanced indexing copies
    if counts.device.type != "cuda":
        return snapshot, None
    host = torch.empty(snapshot.shape, dtype=snapshot.dtype, pin_memory=True)
    host.copy_(snapshot, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


class SlotScheduler:
    """Slots, packing, snapshots and decisions (see the module doc); the driver supplies the jobs
    and drains :attr:`finished`: (job, counts | error | None) for every job that ended."""

    def __init__(self, body: BatchBody, device: torch.device, batch: int, num_slots: int) -> None:
        self.body, self.device, self.batch, self.num_slots = body, device, batch, num_slots
        self.free: deque[int] = deque(range(num_slots))
        self.ready: deque[Job] = deque()  # on the device, with rows to issue in their current stage
        self.waiting: deque[tuple[list[Job], torch.Tensor, torch.cuda.Event | None]] = deque()
        self.finished: list[tuple[Job, object]] = []

    def allocate(self) -> None:
        """The body's per-run buffers (counts for every phase)."""
        self.counts = self.body.allocate(self.num_slots, torch.tensor([int(p) for p in PHASES], device=self.device))

    def load(self, job: Job) -> None:
        job.slot = self.free.popleft()
        self.body.load(job.slot, job.image)
        self.ready.append(job)

    def pack(self, next_job: Callable[[], Job | None], block: bool) -> tuple[list[Segment], list[Job]]:
        """The next batch's rows, oldest image first, and the images whose stage ends in it. When no
        image has rows left and a slot is free, ``next_job()`` gives one to load (None: none now);
        with ``block``, a batch short of images waits for the first pending snapshot (whose images
        may continue or free their slots) instead of ending early."""
        segments: list[Segment] = []
        reached: list[Job] = []
        room = self.batch
        while room:
            if not self.ready:
                job = next_job() if self.free else None
                if job is not None:
                    self.load(job)
                elif block and self.waiting:
                    self.resolve(wait=True, only_first=True)
                else:
                    break
                continue
            job = self.ready[0]
            take = min(room, job.stage_end - job.row)
            segments += job.segments(take)
            job.row += take
            room -= take
            if job.row == job.stage_end:
                reached.append(self.ready.popleft())
        return segments, reached

    def issue(self, segments: list[Segment]) -> None:
        """Hand one batch's rows to the body (no synchronization)."""
        self.body.run(*batch_rows(segments, self.device))

    def snapshot(self, reached: list[Job]) -> None:
        """Copy the counts of images at a stage end off the device (asynchronously on CUDA); images
        at their final stage free their slot at once (zeroed in stream order after the copy)."""
        if reached:
            snapshot, event = counts_to_host(self.counts, [job.slot for job in reached])
            self.release([job for job in reached if job.final])
            self.waiting.append((reached, snapshot, event))

    def release(self, jobs: list[Job]) -> None:
        slots = [job.slot for job in jobs if job.slot is not None]
        if slots:
            self.counts[torch.tensor(slots, device=self.device)] = 0
            self.free.extend(slots)
        for job in jobs:
            job.slot = None

    def resolve(self, wait: bool, only_first: bool = False) -> None:
        """Act on snapshots that reached the host (all of them with ``wait``): a job ends at its last
        stage, when its stopping rule says so, when cancelled, or on an error (non-finite logits);
        otherwise its next stage becomes runnable."""
        while self.waiting and (wait or self.waiting[0][2] is None or self.waiting[0][2].query()):
            reached, host, event = self.waiting.popleft()
            if event is not None:
                event.synchronize()
            stopped = []
            for job, slot_counts in zip(reached, host.numpy()):
                try:
                    counts = None if job.cancelled else job.counts(slot_counts)
                    done = counts is None or job.final or job.decide(job.index, counts, job.stage)
                except Exception as error:  # noqa: BLE001 (this image only; the driver decides what it means)
                    counts, done = error, True
                if not done:
                    job.stage += 1
                    job.since = time.monotonic()
                    self.ready.append(job)
                    continue
                if not job.final:
                    stopped.append(job)
                self.finished.append((job, counts))
            self.release(stopped)
            if only_first:
                return

    def drop_cancelled(self) -> None:
        """Forget cancelled images with rows left (their slot is freed at once)."""
        cancelled = [job for job in self.ready if job.cancelled]
        if cancelled:
            self.ready = deque(job for job in self.ready if not job.cancelled)
            self.release(cancelled)

    def reset(self) -> list[Job]:
        """Forget every image on the device (after a failed batch): counts zeroed, slots freed; returns them."""
        jobs = list(self.ready) + [job for batch, _, _ in self.waiting for job in batch]
        self.ready.clear()
        self.waiting.clear()
        self.counts.zero_()
        self.free = deque(range(self.num_slots))
        for job in jobs:
            job.slot = None
        return jobs

    @property
    def busy(self) -> bool:
        """Whether any image is on the device (rows to issue or a snapshot on its way)."""
        return bool(self.ready or self.waiting)
