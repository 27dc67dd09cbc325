"""Continuous batching: one thread packs the noisy samples of every in-flight request into full batches.

This is :class:`~dmae_fast.certification.stream.StreamingCertifier`'s schedule fed by a queue
instead of a dataset, driving the same batch bodies (``allocate/load/run``): rows
(slot, image index, phase, sample) of many images, oldest image first, are cut into batches of
``batch`` rows; the counts stay on the device and are copied off when an image's stage ends.
Two things differ, and are why the server has its own loop rather than a flag on the streamer:

* **plans per image**, not per run: each request brings its own n0, n and procedure, so the
  counts buffer holds all three phases (selection, estimation, prediction; a row's phase
  position is its :class:`~dmae_fast.noise.Phase` value) and each image walks its own plan;
  a PREDICT and a CERTIFY request share a batch;
* **a clock**: when fewer than ``batch`` rows are waiting, the loop waits for more requests
  until the oldest waiting row is ``max_wait_s`` old, then runs the partial batch.

The noise is the contract's pure function of (seed, image index, phase, sample), so an image's
counts are the same as the offline streamer's for the same seed and index, whatever else
shared its batches (tested). Images stopped early (sequential CERTIFY) or cancelled (timed-out
requests) free their slot at once and the next batch is filled from the queue.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from dmae_fast.certification.core import finite_counts
from dmae_fast.certification.stream import (
    BatchBody,
    Decide,
    SamplingPlan,
    batch_rows,
    counts_to_host,
)
from dmae_fast.noise import MASK32, Phase

PHASES = (Phase.SELECTION, Phase.ESTIMATION, Phase.PREDICTION)  # position in the counts buffer = value
Done = Callable[[object], None]  # called once with the image's counts [phases, classes] or an exception


class QueueFull(Exception):
    """More images than the queue holds: the request is refused (429)."""


class Closed(Exception):
    """The server is stopping: new requests are refused, unfinished ones answered with 503."""


class IndicesExhausted(Exception):
    """Consecutive indices only: the noise contract's image indices [0, 2**32) are used up for this seed."""


class Job:
    """One image of a request: its plan, its progress, where its answer goes."""

    __slots__ = ("image", "plan", "decide", "done", "index", "row", "stage", "slot", "since", "cancelled",
                 "queued", "_starts", "_positions")

    def __init__(self, image: torch.Tensor, plan: SamplingPlan, decide: Decide | None, done: Done) -> None:
        self.image, self.plan, self.decide, self.done = image, plan, decide, done
        self.index = -1  # assigned on admission
        self.row = self.stage = 0
        self.slot: int | None = None
        self.since = 0.0  # when its next rows became runnable (time.monotonic)
        self.cancelled = False
        self.queued = False  # counted against the queue bound (under the scheduler's lock)
        self._starts = np.cumsum((0,) + plan.sizes)
        self._positions = [int(phase) for phase in plan.phases]

    @property
    def stage_end(self) -> int:
        return self.plan.stage_ends[self.stage]

    @property
    def final(self) -> bool:
        return self.stage == len(self.plan.stage_ends) - 1

    def segments(self, take: int) -> list[tuple[int, int, int, int, int]]:
        """(slot, index, phase position, first sample, count) for rows [row, row + take), split at phases."""
        out = []
        for position, start, end in zip(self._positions, self._starts[:-1], self._starts[1:]):
            lo, hi = max(self.row, start), min(self.row + take, end)
            if lo < hi:
                out.append((self.slot, self.index, position, int(lo - start), int(hi - lo)))
        return out

    def counts(self, slot_counts: np.ndarray) -> np.ndarray:
        """This image's rows of a slot's counts [3 phases, classes + 1], in plan order."""
        return slot_counts[self._positions]


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot for /metrics and /healthz."""

    admitted: int  # images admitted, not yet answered
    on_device: int  # images holding a slot
    next_index: int | None  # None: indices are drawn at random (see Scheduler.submit)


class Scheduler:
    """The device-owning thread (see the module doc). ``submit`` and ``cancel`` are thread-safe."""

    def __init__(self, body: BatchBody, device: torch.device, image_shape: tuple[int, ...], batch: int,
                 max_wait_s: float, num_slots: int, max_queue: int, first_index: int | None,
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        self.body, self.device, self.image_shape, self.batch = body, device, tuple(image_shape), batch
        self.max_wait_s, self.num_slots, self.max_queue = max_wait_s, num_slots, max_queue
        self.on_batch = on_batch or (lambda rows, seconds: None)
        self._cond = threading.Condition()
        self._inbox: deque[Job] = deque()
        self._admitted = 0
        self._next_index = first_index
        self._closing = self._abort = False
        self._pending: deque[Job] = deque()  # admitted, not on the device yet (loop thread only from here on)
        self._ready: deque[Job] = deque()  # on the device with rows to issue in their current stage
        self._waiting: deque[tuple[list[Job], torch.Tensor, torch.cuda.Event | None]] = deque()
        self._free: deque[int] = deque(range(num_slots))
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="dmae-serve-scheduler", daemon=True)

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        """Allocate the device buffers, run one warm-up batch (compiles the noise), start serving."""
        self._thread.start()
        self._started.wait()
        if self._startup_error is not None:
            raise self._startup_error

    def submit(self, jobs: list[Job]) -> None:
        """Admit a request's images, all or none, giving each its image index (the noise key).

        With ``first_index`` None (the default), each index is drawn uniformly from [0, 2**32) by
        the operating system's CSPRNG at admission, after the image has arrived: a client cannot
        know the noise its image will meet, even though the seed is public (a client that could
        would be able to pick an input fitted to those particular noise draws, and the certificate's
        guarantee, which is over noise independent of the input, would not hold). Two images may
        draw the same index (probability about m**2 / 2**33 among m images); that costs nothing,
        since each image's noise is still independent of its content. With a ``first_index``, the
        images get consecutive indices, as in an offline run over a dataset: predictable, for
        trusted clients only.
        """
        with self._cond:
            if self._closing:
                raise Closed("the server is shutting down")
            if self._admitted + len(jobs) > self.max_queue:
                raise QueueFull(f"the queue is full ({self._admitted} of {self.max_queue} images in flight); "
                                "retry later")
            if self._next_index is None:
                indices = [secrets.randbits(32) for _ in jobs]
            elif self._next_index + len(jobs) > MASK32 + 1:
                raise IndicesExhausted("this server has used every image index of the noise contract for its "
                                       "seed; restart it with another --seed")
            else:
                indices = list(range(self._next_index, self._next_index + len(jobs)))
                self._next_index += len(jobs)
            now = time.monotonic()
            for job, index in zip(jobs, indices):
                job.index, job.since, job.queued = index, now, True
            self._admitted += len(jobs)
            self._inbox.extend(jobs)
            self._cond.notify()

    def cancel(self, jobs: list[Job]) -> None:
        """Stop sampling these images (a timed-out or abandoned request); their ``done`` is not called.
        They leave the queue bound at once; their rows are dropped before the next batch."""
        with self._cond:
            for job in jobs:
                job.cancelled = True
                self._unqueue(job)
            self._cond.notify()

    def _unqueue(self, job: Job) -> None:
        """(under the lock) Stop counting ``job`` against the queue bound."""
        if job.queued:
            job.queued = False
            self._admitted -= 1

    def stats(self) -> SchedulerStats:
        with self._cond:
            return SchedulerStats(self._admitted, self.num_slots - len(self._free), self._next_index)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float) -> None:
        """Refuse new images, finish the admitted ones within ``timeout_s``, then fail what is left (503)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._cond:
                self._abort = True
                self._cond.notify()
            self._thread.join()

    # ------------------------------------------------------------------ the loop thread

    def _main(self) -> None:
        try:
            phase_ids = torch.tensor([int(p) for p in PHASES], device=self.device)
            self._counts = self.body.allocate(self.num_slots, phase_ids)
            self._warm_up()
        except BaseException as error:  # reported by start() in the caller's thread
            self._startup_error = error
            self._started.set()
            self.body.finish()
            return
        self._started.set()
        try:
            while self._step():
                pass
        except BaseException as error:  # a bug: answer everyone with it rather than leave them hanging
            self._fail_everything(error)
            raise
        finally:
            self.body.finish()

    def _warm_up(self) -> None:
        """One full batch on slot 0 (compiles the noise kernel, captures graphs); its counts are discarded."""
        rows = torch.arange(self.batch, device=self.device)
        zeros = torch.zeros_like(rows)
        self.body.load(0, torch.zeros(self.image_shape, device=self.device))
        self.body.run(zeros, zeros, zeros + int(Phase.PREDICTION), rows)
        self._counts.zero_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _step(self) -> bool:
        """Admit, wait for a full batch (or the clock), run one batch; False when the loop should end."""
        with self._cond:
            self._pending.extend(self._inbox)
            self._inbox.clear()
            abort = self._abort
        if abort:
            self._fail_everything(Closed("the server stopped before this request was answered"))
            return False
        self._drop_cancelled()
        self._resolve(wait=False)
        rows, oldest = self._runnable()
        if rows == 0:
            if self._waiting:
                self._resolve(wait=True)
                return True
            with self._cond:
                if self._inbox or self._abort:
                    return True
                if self._closing and not self._pending and not self._ready:
                    return False
                self._cond.wait(None if not self._pending else 0.05)
            return True
        if rows < self.batch and not self._closing:
            delay = oldest + self.max_wait_s - time.monotonic()
            if delay > 0:
                with self._cond:
                    if not self._inbox and not self._abort:
                        self._cond.wait(delay)
                return True
        self._run_one_batch()
        return True

    def _runnable(self) -> tuple[int, float]:
        """Rows the next batch could take now, and when the oldest of them became runnable."""
        rows, oldest = 0, float("inf")
        for job in itertools.chain(self._ready, itertools.islice(self._pending, len(self._free))):
            rows += job.stage_end - job.row
            oldest = min(oldest, job.since)
            if rows >= self.batch:
                break
        return rows, oldest

    def _run_one_batch(self) -> None:
        segments: list[tuple[int, int, int, int, int]] = []
        reached: list[Job] = []  # images whose stage ends in this batch
        room = self.batch
        while room:
            if not self._ready:
                if not (self._pending and self._free):
                    break
                self._load(self._pending.popleft())
                continue
            job = self._ready[0]
            take = min(room, job.stage_end - job.row)
            segments += job.segments(take)
            job.row += take
            room -= take
            if job.row == job.stage_end:
                reached.append(self._ready.popleft())
        if not segments:
            return
        start = time.perf_counter()
        try:
            self._issue(segments)
        except Exception as error:  # the classifier failed: fail this batch's images, keep serving
            self._fail_on_device(RuntimeError(f"the classifier failed: {type(error).__name__}: {error}"), reached)
            return
        self._snapshot(reached)
        self._resolve(wait=False)
        self.on_batch(self.batch - room, time.perf_counter() - start)

    def _load(self, job: Job) -> None:
        job.slot = self._free.popleft()
        self.body.load(job.slot, job.image)
        self._ready.append(job)

    def _issue(self, segments: list[tuple[int, int, int, int, int]]) -> None:
        """Hand one batch's rows (slot, image index, phase position, sample) to the body."""
        self.body.run(*batch_rows(segments, self.device))

    def _snapshot(self, reached: list[Job]) -> None:
        """Copy the counts of images at a stage end off the device (asynchronously on CUDA);
        images at their final stage free their slot at once (zeroed in stream order after the copy)."""
        if not reached:
            return
        snapshot, event = counts_to_host(self._counts, [job.slot for job in reached])
        self._release([job for job in reached if job.final])
        self._waiting.append((reached, snapshot, event))

    def _release(self, jobs: list[Job]) -> None:
        slots = [job.slot for job in jobs if job.slot is not None]
        if slots:
            self._counts[torch.tensor(slots, device=self.device)] = 0
            self._free.extend(slots)
        for job in jobs:
            job.slot = None

    def _resolve(self, wait: bool) -> None:
        """Act on snapshots that reached the host: answer finished images, schedule the next stage of others."""
        while self._waiting and (wait or self._waiting[0][2] is None or self._waiting[0][2].query()):
            reached, host, event = self._waiting.popleft()
            if event is not None:
                event.synchronize()
            finished, stopped = [], []
            for job, slot_counts in zip(reached, host.numpy()):
                try:
                    counts = None if job.cancelled else finite_counts(job.index, job.counts(slot_counts))
                    done = counts is None or job.final or job.decide(job.index, counts, job.stage)
                except Exception as error:  # noqa: BLE001 (non-finite logits: this image only)
                    counts, done = error, True
                if not done:
                    job.stage += 1
                    job.since = time.monotonic()
                    self._ready.append(job)
                    continue
                if not job.final:
                    stopped.append(job)
                finished.append((job, counts))
            self._release(stopped)
            self._finish(finished)

    def _finish(self, finished: list[tuple[Job, object]]) -> None:
        for job, result in finished:
            if not job.cancelled:
                _call(job.done, result)
        if finished:
            with self._cond:
                for job, _ in finished:
                    self._unqueue(job)

    def _drop_cancelled(self) -> None:
        """Forget cancelled images that are queued or have rows left (their slot is freed at once)."""
        dropped = [job for job in self._pending if job.cancelled]
        if dropped:
            self._pending = deque(job for job in self._pending if not job.cancelled)
        on_device = [job for job in self._ready if job.cancelled]
        if on_device:
            self._ready = deque(job for job in self._ready if not job.cancelled)
            self._release(on_device)

    def _fail_on_device(self, error: BaseException, reached: list[Job]) -> None:
        """A batch failed: every image on the device gets ``error``; the counts and slots are reset."""
        jobs = list(self._ready) + reached + [job for batch, _, _ in self._waiting for job in batch]
        self._ready.clear()
        self._waiting.clear()
        self._counts.zero_()
        self._free = deque(range(self.num_slots))
        for job in jobs:
            job.slot = None
        self._finish([(job, error) for job in jobs])

    def _fail_everything(self, error: BaseException) -> None:
        with self._cond:
            self._pending.extend(self._inbox)
            self._inbox.clear()
        jobs = list(self._pending) + list(self._ready) + [job for batch, _, _ in self._waiting for job in batch]
        self._pending.clear()
        self._ready.clear()
        self._waiting.clear()
        for job in jobs:
            if not job.cancelled:
                _call(job.done, error)
        with self._cond:
            for job in jobs:
                self._unqueue(job)


def _call(done: Done, result: object) -> None:
    try:
        done(result)
    except Exception:  # noqa: BLE001 (a callback's failure must not stop the loop)
        pass


def default_slots(batch: int, image_numel: int, budget_bytes: int = 256 << 20) -> int:
    """Images on the device at once: enough for a batch of one-row plans, within ``budget_bytes`` of images."""
    return max(8, min(batch + 2, budget_bytes // (4 * image_numel)))
