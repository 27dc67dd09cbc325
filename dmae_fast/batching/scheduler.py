"""The one scheduler: the noisy samples of many images packed into full batches, counts on the device.

Each image (a :class:`Job`) brings its :class:`~dmae_fast.stats.plan.SamplingPlan` and, for sequential
CERTIFY, a stopping rule consulted at the plan's looks. The rows of the images on the device are laid end to
end, oldest first, and cut into batches of ``batch`` rows. A row is (slot, image index, phase, sample index):
the slot holds the clean image, the noise is the contract's pure function of the rest, and the predicted class
is added to ``counts[slot, phase, class]`` on the device. At a stage end the image's counts are copied back
in queue order (:mod:`~dmae_fast.batching.device_queue`), so the host never waits per batch.

On an asynchronous device a dataset's batch short of rows takes earlier decisions, then rows past looks whose
decision is on its way (never past the next look; in the look's own batch, in a spare slot folded in after the
look's copy): a decision reads exactly the counts at its look, and rows drawn for an image that then stops are
counted as unused (:class:`LoopStats`; docs/architecture.md, "Decisions off the device's path"). A run that keeps
classes (``keep``; plans without looks) copies each image's kept classes with its final counts. Under a
:class:`RowSplit` (``--shard samples``) every process runs the same schedule, counts its share of each batch
and sums the counts at a stage end before anything is decided. Driven only through
:class:`~dmae_fast.batching.engine_loop.EngineLoop`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import NamedTuple

import torch

from dmae_fast.batching.device_queue import Ready, device_queue
from dmae_fast.batching.job import BatchBody, Job, RowSplit, Segment, batch_rows, kept_buffer, phase_ids


@dataclass(frozen=True)
class LoopStats:
    """Where the scheduler stands (:meth:`SlotScheduler.stats`, the engine loop's ``stats``), since it started."""

    queued: int  # added, not on the device yet
    on_device: int  # holding a slot
    batches: int = 0  # handed to the body (the whole schedule's, under a row split)
    drawn: int = 0  # rows in those batches
    unused: int = 0  # of which drawn past the look where their image then ended (in no decision nor result)
    waited_s: float = 0.0  # host time blocked on counts on their way to the host
    stalled_s: float = 0.0  # device idle that the host saw: from finding every queued batch done to the next batch


class Snapshot(NamedTuple):
    """Counts of images at a stage end on their way to the host, after batch number ``batch``."""

    jobs: list[Job]
    host: torch.Tensor
    ready: Ready | None
    batch: int
    kept: torch.Tensor | None = None  # their kept classes, in a run that keeps them


class SlotScheduler:
    """Slots, packing, snapshots and decisions (see the module doc), driven only by the engine loop. Jobs
    come from :meth:`add`, then from ``source`` (called only when a slot is free and no image has rows
    left, so a dataset is read no further ahead than the device needs; None: it has no more)."""

    def __init__(self, body: BatchBody, device: torch.device, batch: int, num_slots: int,
                 source: Callable[[], Job | None] | None = None, split: RowSplit | None = None,
                 keep: int = 0) -> None:
        self.body, self.device, self.batch, self.num_slots = body, device, batch, num_slots
        self._source, self._split = source, split
        self._free: deque[int] = deque(range(num_slots))
        self._pending: deque[Job] = deque()  # added, not on the device yet
        self._ready: deque[Job] = deque()  # on the device, with rows to issue in their current stage
        self._ahead: deque[Job] = deque()  # at a look whose decision is on its way, with rows before the next look
        self._since: dict[Job, float] = {}  # pending and ready jobs: when their next rows became runnable
        self._started: dict[Job, None] = {}  # taken onto the device (its load may have failed), not ended yet
        self._waiting: deque[Snapshot] = deque()
        self._cancelled: set[Job] = set()  # cancelled while a snapshot of theirs is on its way
        self._dropped: set[Job] = set()  # ended while the snapshot of a later look of theirs is on its way
        self._finished: list[tuple[Job, object]] = []
        self._queue = device_queue(body, device)
        self._asynchronous = split is None and self._queue.mark() is not None  # batches run after run returns
        self._last_batch: Ready | None = None  # marks the latest batch done
        self._stall_start: float | None = None  # when the host saw the device run out of work, until the next batch
        self._batches = self._drawn = self._unused = 0
        self._waited_s = self._stalled_s = 0.0
        self._counts = body.allocate(num_slots, phase_ids(device))
        self._kept = kept_buffer(body, num_slots, keep)

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
        self._started[job] = None
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
        """The next batch's rows and the images whose stage ends in it: rows of the images on the device, oldest
        first, then a new image while a slot is free; with ``block`` (a dataset), a short batch as the module doc
        says, waiting for the latest batch's decisions only when no row is left at all."""
        segments: list[Segment] = []
        reached: list[Job] = []
        room, ahead = self.batch, False
        while room:
            if self._ready:
                room -= self._take(self._ready, self._ready[0].stage_end, room, segments, reached)
                continue
            job = self._next() if self._free else None
            if job is not None:
                self._load(job)
            elif block and not ahead and self._waiting and self._waiting[0].batch < self._batches - 1:
                self.resolve(wait=True, only_first=True)
            elif block and self._ahead:
                room -= self._take(self._ahead, self._ahead[0].next_end, room, segments, reached)
                ahead = True
            elif block and self._free and (job := self._crossing(reached)) is not None:
                room -= self._cross(job, room, segments)
                ahead = True
            elif block and not ahead and self._waiting:
                self.resolve(wait=True, only_first=True)
            else:
                break
        return segments, reached

    def _take(self, jobs: deque[Job], end: int, room: int, segments: list[Segment], reached: list[Job]) -> int:
        """Up to ``room`` rows of ``jobs[0]`` up to row ``end``; it leaves ``jobs`` for ``reached`` at ``end``."""
        job = jobs[0]
        take = min(room, end - job.row)
        segments += job.segments(take)
        job.row += take
        if job.row == end:
            reached.append(jobs.popleft())
            self._since.pop(job, None)
        return take

    def _crossing(self, reached: list[Job]) -> Job | None:
        """An image at its look in this batch, its earlier looks decided: it may draw past it (asynchronous only)."""
        crossing = (job for job in reached if job.spare is None and job.row == job.stage_end and not job.final)
        return next(crossing, None) if self._asynchronous else None

    def _cross(self, job: Job, room: int, segments: list[Segment]) -> int:
        """Up to ``room`` rows of ``job``'s next stage in this batch, counted in a spare slot."""
        job.spare = self._free.popleft()
        self.body.load(job.spare, job.image)
        take = min(room, job.next_end - job.row)
        segments += job.segments(take, job.spare)
        job.row += take
        return take

    def issue(self, segments: list[Segment]) -> int:
        """Hand one batch's rows (this process's share) to the body, without synchronizing; the rows handed."""
        rows = sum(segment[4] for segment in segments)
        self._batches += 1
        self._drawn += rows
        part = None if self._split is None else self._split.share(rows)
        if part is not None and part[0] == part[1]:
            return 0
        if self._stall_start is not None:
            self._stalled_s += time.perf_counter() - self._stall_start
            self._stall_start = None
        self.body.run(*batch_rows(segments, self.device, part))
        self._last_batch = self._queue.mark()
        return rows if part is None else part[1] - part[0]

    def snapshot(self, reached: list[Job]) -> None:
        """Copy the counts of images at a stage end off the device, in queue order after the batch; then rows past it
        in a spare slot join the image's own (and the next look's counts are copied where they reach it). Images
        at their plan's end free their slot (zeroed after the copies), images short of their next look draw ahead."""
        if not reached:
            return
        slots = [job.slot for job in reached]
        if self._split is None:  # the kept classes first: the counts' mark covers both copies
            kept = None if self._kept is None else self._queue.to_host(self._kept, slots)[0]
            self._waiting.append(Snapshot(reached, *self._queue.to_host(self._counts, slots), self._batches - 1, kept))
        else:  # every process's sum, before anything is decided (each kept class was written by one process)
            summed = self._split.summed(self._queue.gather(self._counts, slots))
            kept = None if self._kept is None else self._split.summed(self._queue.gather(self._kept, slots))
            self._waiting.append(Snapshot(reached, summed, None, self._batches - 1, kept))
        for job in (crossed := [job for job in reached if job.spare is not None]):
            self._queue.fold(self._counts, job.spare, job.slot)
            self._free.append(job.spare)
            job.spare = None
        if at_next := [job for job in crossed if job.row == job.next_end]:
            self._waiting.append(Snapshot(at_next, *self._queue.to_host(self._counts, [job.slot for job in at_next]),
                                          self._batches - 1))
        self._release([job for job in reached if job.row == job.plan.total])
        self._ahead.extend(job for job in reached if not job.final and job.stage_end <= job.row < job.next_end)

    def _release(self, jobs: list[Job]) -> None:
        slots = [job.slot for job in jobs if job.slot is not None]
        if slots:
            self._queue.clear(self._counts, slots)
            if self._kept is not None:
                self._queue.clear(self._kept, slots)
            self._free.extend(slots)
        for job in jobs:
            job.slot = None

    def resolve(self, wait: bool, only_first: bool = False) -> None:
        """Act on snapshots that reached the host (all of them with ``wait``): a job ends at its last
        stage, when its stopping rule says so, when cancelled, or on an error (non-finite logits);
        otherwise its next stage becomes runnable."""
        while self._waiting and (wait or self._waiting[0].ready is None or self._waiting[0].ready.query()):
            snapshot = self._waiting.popleft()
            if snapshot.ready is not None:
                self._wait(snapshot.ready)
            ended = []
            kept = [None] * len(snapshot.jobs) if snapshot.kept is None else snapshot.kept.numpy()
            for job, slot_counts, slot_kept in zip(snapshot.jobs, snapshot.host.numpy(), kept):
                if job in self._dropped:  # it ended at an earlier look
                    self._dropped.remove(job)
                    continue
                cancelled = job in self._cancelled
                try:
                    counts = None if cancelled else job.counts(slot_counts)
                    if slot_kept is not None and not cancelled:
                        job.kept = job.kept_classes(slot_kept)
                    done = cancelled or job.final or job.decide(job.index, counts, job.stage)
                except Exception as error:  # noqa: BLE001 (this image only; the driver decides what it means)
                    counts, done = error, True
                if not done:
                    self._advance(job)
                    continue
                ended.append(job)
                del self._started[job]
                if cancelled:
                    self._cancelled.remove(job)
                else:
                    self._finished.append((job, counts))
            self._end(ended)
            if only_first:
                return

    def _advance(self, job: Job) -> None:
        """Past a look: the rest of the next stage becomes runnable, or, where its rows were all drawn
        ahead, the job is at that stage's look (whose snapshot is on its way)."""
        job.stage += 1
        if job in self._ahead:
            self._ahead.remove(job)
        if job.row < job.stage_end:
            self._since[job] = time.monotonic()
            self._ready.append(job)
        elif not job.final:
            self._ahead.append(job)

    def _end(self, jobs: list[Job]) -> None:
        """Jobs ended at a look: rows drawn past it are unused, a later snapshot of theirs is ignored."""
        for job in jobs:
            self._unused += job.row - job.stage_end
            if job.past_next_look:
                self._dropped.add(job)
            if job in self._ahead:
                self._ahead.remove(job)
        self._release(jobs)

    def _wait(self, ready: Ready) -> None:
        """Wait for a snapshot; if every batch queued is done by then, the device is idle from now until
        the next batch (a stall)."""
        start = time.perf_counter()
        ready.synchronize()
        now = time.perf_counter()
        self._waited_s += now - start
        if self._stall_start is None and self._last_batch is not None and self._last_batch.query():
            self._stall_start = now

    def stats(self) -> LoopStats:
        return LoopStats(len(self._pending), self.num_slots - len(self._free), self._batches, self._drawn,
                         self._unused, self._waited_s, self._stalled_s)

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
            for job in dropped:
                del self._started[job]
        self._ahead = deque(job for job in self._ahead if job not in gone)
        self._cancelled.update(job for snapshot in self._waiting for job in snapshot.jobs
                               if job in gone and job not in self._dropped)
        for job in gone:
            self._since.pop(job, None)

    def reset(self, pending: bool = False) -> list[Job]:
        """Forget every job taken onto the device and not ended (its load included), and with ``pending`` the
        queued ones too (after a body call failed at any point of a step, or when the driver stops): counts zeroed,
        slots freed; returns them (cancelled ones aside)."""
        jobs = [job for job in self._started if job not in self._cancelled]
        for job in jobs:
            self._since.pop(job, None)
        if pending:
            jobs = list(self._pending) + jobs
            self._pending.clear()
            self._since.clear()
        self._started.clear()
        self._ready.clear()
        self._ahead.clear()
        self._waiting.clear()
        self._cancelled.clear()
        self._dropped.clear()
        self._queue.clear(self._counts)
        if self._kept is not None:
            self._queue.clear(self._kept)
        self._free = deque(range(self.num_slots))
        for job in jobs:
            job.slot = job.spare = None
        return jobs

    @property
    def busy(self) -> bool:
        """Whether any job is queued or on the device, or the source may have more."""
        return bool(self._pending or self._ready or self._waiting or self._source is not None)

