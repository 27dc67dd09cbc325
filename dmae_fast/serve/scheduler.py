"""Continuous batching: the server's device thread drives the one scheduler from a request queue.

:class:`~dmae_fast.certification.scheduler.SlotScheduler` packs the rows of every in-flight image
into full batches, as the offline streamer does; this thread adds what a server needs around it:

* **admission**: each request's images become :class:`~dmae_fast.certification.scheduler.Job` objects
  with their own plan (PREDICT and CERTIFY images share batches), a bounded queue, and an
  image index per image (the noise key; see :meth:`Scheduler.submit`);
* **a clock**: when fewer than ``batch`` rows are waiting, the loop waits for more requests
  until the oldest waiting row is ``max_wait_s`` old, then runs the partial batch;
* **cancellation and failure**: a timed-out request's images free their slots at once; a failed
  batch fails the images on the device and the server keeps serving.

The noise is the contract's pure function of (seed, image index, phase, sample), so an image's
counts are the same as the offline streamer's for the same seed and index, whatever else
shared its batches (tested).
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dmae_fast.certification.scheduler import BatchBody, Job, SlotScheduler
from dmae_fast.noise import MASK32
from dmae_fast.stats.plan import Phase

Done = Callable[[object], None]  # called once with the image's counts [phases, classes] or an exception


class QueueFull(Exception):
    """More images than the queue holds: the request is refused (429)."""


class Closed(Exception):
    """The server is stopping: new requests are refused, unfinished ones answered with 503."""


class IndicesExhausted(Exception):
    """Consecutive indices only: the noise contract's image indices [0, 2**32) are used up for this seed."""


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
        self._slots = SlotScheduler(body, device, batch, num_slots)  # the loop thread's
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
            return SchedulerStats(self._admitted, self.num_slots - len(self._slots.free), self._next_index)

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
            self._slots.allocate()
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
        self._slots.counts.zero_()
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
            if self._slots.waiting:
                self._resolve(wait=True)
                return True
            with self._cond:
                if self._inbox or self._abort:
                    return True
                if self._closing and not self._pending and not self._slots.ready:
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
        for job in itertools.chain(self._slots.ready, itertools.islice(self._pending, len(self._slots.free))):
            rows += job.stage_end - job.row
            oldest = min(oldest, job.since)
            if rows >= self.batch:
                break
        return rows, oldest

    def _run_one_batch(self) -> None:
        segments, reached = self._slots.pack(lambda: self._pending.popleft() if self._pending else None, block=False)
        if not segments:
            return
        start = time.perf_counter()
        try:
            self._slots.issue(segments)
        except Exception as error:  # the classifier failed: fail this batch's images, keep serving
            self._fail_on_device(RuntimeError(f"the classifier failed: {type(error).__name__}: {error}"), reached)
            return
        self._slots.snapshot(reached)
        self._resolve(wait=False)
        self.on_batch(sum(segment[4] for segment in segments), time.perf_counter() - start)

    def _resolve(self, wait: bool) -> None:
        """Answer the images whose snapshots say they are done (the others continue on the device)."""
        self._slots.resolve(wait)
        finished, self._slots.finished = self._slots.finished, []
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
        if any(job.cancelled for job in self._pending):
            self._pending = deque(job for job in self._pending if not job.cancelled)
        self._slots.drop_cancelled()

    def _fail_on_device(self, error: BaseException, reached: list[Job]) -> None:
        """A batch failed: every image on the device gets ``error``; the counts and slots are reset."""
        jobs = self._slots.reset() + reached
        self._finish([(job, error) for job in jobs])

    def _fail_everything(self, error: BaseException) -> None:
        with self._cond:
            self._pending.extend(self._inbox)
            self._inbox.clear()
        jobs = list(self._pending) + list(self._slots.ready) + [job for batch, _, _ in self._slots.waiting
                                                                 for job in batch]
        self._pending.clear()
        self._slots.ready.clear()
        self._slots.waiting.clear()
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
