"""The engine loop: jobs in, ``step()`` until done; the one surface every driver of the scheduler uses.

:class:`EngineLoop` owns a :class:`~dmae_fast.batching.scheduler.SlotScheduler` and each
:meth:`EngineLoop.step` runs at most one batch and returns the jobs that ended (nano-vllm's shape). A step
in which the body fails (loading an image, running a batch, copying, clearing or folding counts, waiting for
them) ends every job on the device with :class:`BatchFailed`, the one being loaded included (counts zeroed,
slots freed) and leaves the queued ones queued: the dataset run moves to the next body, the server answers
those images with the failure and keeps serving. What the job source raises is raised as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import torch

from dmae_fast.batching.job import BatchBody, Job, RowSplit
from dmae_fast.batching.scheduler import LoopStats, SlotScheduler
from dmae_fast.stats.plan import Phase

Finished = tuple[Job, object]  # (job, its counts [plan phases, classes] | the exception that ended it)


class BatchFailed(Exception):
    """How a job ends when the body failed in a batch while it was on the device; ``error`` is the body's."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class EngineLoop:
    """One body, ``num_slots`` images on the device, batches of ``batch`` rows; jobs from :meth:`add`,
    then from ``source`` (see :class:`SlotScheduler`). ``on_batch(rows, seconds)`` is told of every batch
    issued (the rows this process ran, and the host time to issue them; on a CPU, to run them). ``keep``: each
    ended job's ``kept`` holds its classes of its first ``keep`` estimation samples (:class:`SlotScheduler`)."""

    def __init__(self, body: BatchBody, device: torch.device, batch: int, num_slots: int,
                 source: Callable[[], Job | None] | None = None,
                 on_batch: Callable[[int, float], None] | None = None, split: RowSplit | None = None,
                 keep: int = 0) -> None:
        self.body, self.device, self.batch, self.on_batch = body, device, batch, on_batch
        self.held_until: float | None = None  # after a step that held a partial batch back: when it is due
        self._source = source
        self._source_error: Exception | None = None  # what the source raised: no body failure
        self._slots = SlotScheduler(body, device, batch, num_slots, None if source is None else self._next, split,
                                    keep)

    def add(self, job: Job, since: float | None = None) -> None:
        """Queue ``job``; its rows count as runnable from ``since`` (``time.monotonic()``; default now)."""
        self._slots.add(job, time.monotonic() if since is None else since)

    def cancel(self, jobs: Collection[Job]) -> None:
        """Forget ``jobs``: their slots are freed and they are never returned by :meth:`step`."""
        self._slots.cancel(jobs)

    def step(self, max_wait_s: float | None = None) -> list[Finished]:
        """Act on the snapshots on the host, run at most one batch; the jobs that ended.

        ``max_wait_s`` None (a dataset): the batch is filled, waiting for snapshots on their way
        where rows are short; with no rows left, waits for the snapshots. A number (a server): a batch
        short of rows runs once its oldest row has been runnable for ``max_wait_s`` (until then
        :attr:`held_until` says when); with no rows runnable, waits for the snapshots on their way.
        """
        self.held_until = None
        try:
            issued = self._body_calls(max_wait_s)
        except Exception as error:  # noqa: BLE001 (the body failed: its images end, the driver decides)
            if error is self._source_error:
                raise
            failed = BatchFailed(error)
            return self._slots.drain() + [(job, failed) for job in self._slots.reset()]
        if issued is not None and self.on_batch is not None:
            self.on_batch(*issued)
        return self._slots.drain()

    def _body_calls(self, max_wait_s: float | None) -> tuple[int, float] | None:
        """The part of :meth:`step` that calls the body; the rows issued and the time to issue them (None: none)."""
        slots = self._slots
        if max_wait_s is None:
            segments, reached = slots.pack(block=True)
        else:
            slots.resolve(wait=False)
            rows, oldest = slots.runnable()
            if 0 < rows < self.batch and oldest + max_wait_s > time.monotonic():
                self.held_until = oldest + max_wait_s
                return None
            segments, reached = slots.pack(block=False)
        issued = None
        if segments:
            start = time.perf_counter()
            rows = slots.issue(segments)
            slots.snapshot(reached)
            issued = rows, time.perf_counter() - start
        slots.resolve(wait=not segments)
        return issued

    def _next(self) -> Job | None:
        """The source's next job; what it raises is kept, so that :meth:`step` raises it instead of failing the body."""
        assert self._source is not None, "handed to the scheduler only with a source"
        try:
            return self._source()
        except Exception as error:
            self._source_error = error
            raise

    def fail_all(self, error: BaseException) -> list[Finished]:
        """End every job, queued or on the device, with ``error`` (counts zeroed, slots freed)."""
        return [(job, error) for job in self._slots.reset(pending=True)]

    def warm_up(self, image_shape: tuple[int, ...]) -> None:
        """One full batch on slot 0 (compiles the noise kernel, captures graphs); its counts are discarded."""
        rows = torch.arange(self.batch, device=self.device)
        zeros = torch.zeros_like(rows)
        self.body.load(0, torch.zeros(image_shape, device=self.device))
        self.body.run(zeros, zeros, zeros + int(Phase.PREDICTION), rows)
        self._slots.reset()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def stats(self) -> LoopStats:
        """Jobs queued and on the device; batches, rows drawn and unused, time waited and stalled so far."""
        return self._slots.stats()

    @property
    def busy(self) -> bool:
        """Whether a job is queued or on the device, or the source may have more."""
        return self._slots.busy
