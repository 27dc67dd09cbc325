"""Continuous batching: the server's device thread steps an :class:`~dmae_fast.batching.engine_loop.EngineLoop`,
which packs the rows of every in-flight image into full batches, and adds admission (a bounded queue; an image
index, the noise key, per image), a clock (a partial batch runs once its oldest row is ``max_wait_s`` old),
cancellation and failure (a failed batch fails the images on the device; the server keeps serving). An image's
counts are the offline streamer's for the same seed and index, whatever else shared its batches."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dmae_fast.batching.engine_loop import BatchFailed, EngineLoop, Finished
from dmae_fast.batching.scheduler import BatchBody, Job
from dmae_fast.noise.compiled import main_thread_traces_first
from dmae_fast.noise.contract import MASK32

Done = Callable[[object], None]  # called once with the image's counts [phases, classes] or an exception


class QueueFull(Exception):
    """More images than the queue holds: the request is refused (429)."""


class Closed(Exception):
    """The server is stopping: new requests are refused, unfinished ones answered with 503."""


class IndicesExhausted(Exception):
    """Consecutive indices only: the noise contract's image indices [0, 2**32) are used up for this seed."""


@dataclass(frozen=True)
class DeviceThreadStats:
    """A snapshot for /metrics and /healthz."""

    admitted: int  # images admitted, not yet answered
    on_device: int  # images holding a slot
    next_index: int | None  # None: indices are drawn at random (see DeviceThread.submit)


class DeviceThread:
    """The device-owning thread (see the module doc). ``submit`` and ``cancel`` are thread-safe."""

    def __init__(self, body: BatchBody, device: torch.device, image_shape: tuple[int, ...], batch: int,
                 max_wait_s: float, num_slots: int, max_queue: int, first_index: int | None,
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        self.body, self.device, self.image_shape, self.batch = body, device, tuple(image_shape), batch
        self.max_wait_s, self.num_slots, self.max_queue, self.on_batch = max_wait_s, num_slots, max_queue, on_batch
        self._cond = threading.Condition()
        self._answers: dict[Job, Done] = {}  # admitted images not yet answered nor cancelled: where each answer goes
        self._inbox: list[tuple[Job, float]] = []  # admitted (and when), not yet handed to the engine loop
        self._cancels: list[Job] = []  # cancelled, not yet forgotten by the engine loop
        self._next_index = first_index
        self._closing = self._abort = False
        self._loop: EngineLoop | None = None  # built by the loop thread, which allocates its buffers
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="dmae-serve-scheduler", daemon=True)

    def start(self) -> None:
        """Allocate the device buffers, run one warm-up batch (compiles the noise), start serving."""
        main_thread_traces_first()  # the scheduler thread compiles, and ends when the server stops
        self._thread.start()
        self._started.wait()
        if self._startup_error is not None:
            raise self._startup_error

    def submit(self, jobs: list[Job], done: list[Done]) -> None:
        """Admit a request's images, all or none, giving each its image index (the noise key); ``done[i]`` gets
        image i's answer. With ``first_index`` None, each index is drawn by the OS's CSPRNG after the image has
        arrived, so a client cannot know the noise its image will meet (docs/serving.md, "Noise a client cannot
        predict"); otherwise indices are consecutive, as in an offline dataset run: for trusted clients only."""
        with self._cond:
            if self._closing:
                raise Closed("the server is shutting down")
            if len(self._answers) + len(jobs) > self.max_queue:
                raise QueueFull(f"the queue is full ({len(self._answers)} of {self.max_queue} images in flight); "
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
            for job, index, answer in zip(jobs, indices, done, strict=True):
                job.index = index
                self._answers[job] = answer
                self._inbox.append((job, now))
            self._cond.notify()

    def cancel(self, jobs: list[Job]) -> None:
        """Stop sampling these images (a timed-out or abandoned request); they are not answered.
        They leave the queue bound at once; their rows are dropped before the next batch."""
        with self._cond:
            for job in jobs:
                self._answers.pop(job, None)
            self._cancels += jobs
            self._cond.notify()

    def stats(self) -> DeviceThreadStats:
        with self._cond:
            on_device = self._loop.stats().on_device if self._loop is not None else 0
            return DeviceThreadStats(len(self._answers), on_device, self._next_index)

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

    def _main(self) -> None:
        try:
            self._loop = EngineLoop(self.body, self.device, self.batch, self.num_slots, on_batch=self.on_batch)
            self._loop.warm_up(self.image_shape)
        except BaseException as error:  # reported by start() in the caller's thread
            self._startup_error = error
            self._started.set()
            self.body.finish()
            return
        self._started.set()
        try:
            while self._step(self._loop):
                pass
        except BaseException as error:  # a bug: answer everyone with it rather than leave them hanging
            self._fail_everything(self._loop, error)
            raise
        finally:
            self.body.finish()

    def _step(self, loop: EngineLoop) -> bool:
        """Hand over the admitted and the cancelled, take one step of the loop (the clock held by ``max_wait_s``
        until closing), answer; then wait while there is nothing to run now. False when the loop should end."""
        with self._cond:
            inbox, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
            abort, closing = self._abort, self._closing
        if abort:
            self._fail_everything(loop, Closed("the server stopped before this request was answered"))
            return False
        for job, admitted in inbox:
            loop.add(job, admitted)
        if cancels:
            loop.cancel(cancels)
        self._answer(loop.step(0.0 if closing else self.max_wait_s))
        with self._cond:
            if self._inbox or self._cancels or self._abort:
                return True
            if not loop.busy:
                if self._closing:
                    return False
                self._cond.wait()
            elif loop.held_until is not None:
                self._cond.wait(loop.held_until - time.monotonic())
        return True

    def _answer(self, finished: list[Finished]) -> None:
        """Send each ended image its counts or error (a failed batch's: the classifier's failure), unless cancelled."""
        with self._cond:
            answers = [(self._answers.pop(job, None), result) for job, result in finished]
        for done, result in answers:
            if isinstance(result, BatchFailed):
                result = RuntimeError(f"the classifier failed: {result}")
            if done is not None:
                with contextlib.suppress(Exception):  # a callback's failure must not stop the loop
                    done(result)

    def _fail_everything(self, loop: EngineLoop, error: BaseException) -> None:
        with self._cond:
            inbox, self._inbox = self._inbox, []
        self._answer([(job, error) for job, _ in inbox] + loop.fail_all(error))


def default_slots(batch: int, image_numel: int, budget_bytes: int = 256 << 20) -> int:
    """Images on the device at once: enough for a batch of one-row plans, within ``budget_bytes`` of images."""
    return max(8, min(batch + 2, budget_bytes // (4 * image_numel)))
