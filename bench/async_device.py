"""An emulated asynchronous device: a GPU's timing on a CPU, to see when the scheduler leaves it idle.

:class:`EmulatedDevice` is one worker thread that runs queued work in order, as a CUDA stream does, and the
:class:`~dmae_fast.batching.device_queue.DeviceQueue` through which the scheduler reads and clears the counts
(:class:`QueuedDevice`): a copy of counts to the host is filled only when the worker reaches it, after the
batches queued before it, and the :class:`Marker` that comes with it is what the scheduler waits on, as on a
CUDA event.
:class:`AsyncBody` puts any batch body on it: ``load`` and ``run`` queue the body's calls and return at once;
each batch takes ``batch_s`` seconds on the device's clock (its real work, then a wait until the time is up)
whatever its rows, as a batch padded to a CUDA graph's size does. The device records its busy and idle time
(:class:`DeviceTimes`).
"""

from __future__ import annotations

import functools
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dmae_fast.batching.scheduler import BatchBody

MAX_QUEUED = 16  # batches the host may queue ahead (a CUDA launch queue holds a bounded number)


@dataclass(frozen=True)
class DeviceTimes:
    """What the emulated device did: ``idle_s`` counts the time between batches (a batch ended before the next was
    queued; not before the first one nor after the last), ``idle_waited_s`` the part of it during which the host
    waited for a marker (a snapshot of counts: the device sat idle waiting for a decision)."""

    batches: int
    busy_s: float  # running batches
    idle_s: float
    idle_waited_s: float
    overran: int  # batches whose real work alone took longer than batch_s


class Marker:
    """Work queued on a :class:`QueuedDevice`, done once the device has reached it."""

    def __init__(self, device: QueuedDevice) -> None:
        self._device = device
        self.done = threading.Event()

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        """Wait until done (the device notes that the host waited); raises what failed on the device."""
        self._device.host_waits(self.done)


class QueuedDevice:
    """A device that runs submitted work in order: the scheduler's queue operations on the counts, as work
    items; a subclass runs the items (:meth:`submit`, :meth:`host_waits`, :meth:`drain`)."""

    batch_s: float

    def submit(self, work: Callable[[], object], batch: bool = False) -> None:
        """Queue ``work`` (a batch of rows with ``batch``)."""
        raise NotImplementedError

    def host_waits(self, done: threading.Event) -> None:
        """The host waits until ``done`` is set (by the work item of a marker)."""
        raise NotImplementedError

    def drain(self) -> None:
        """Wait until everything queued is done."""
        raise NotImplementedError

    def mark(self) -> Marker:
        marker = Marker(self)
        self.submit(marker.done.set)
        return marker

    def to_host(self, counts: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, Marker]:
        """A host tensor that the device fills with ``counts[slots]`` when it gets there (-1 until then)."""
        host = torch.full((len(slots), *counts.shape[1:]), -1, dtype=counts.dtype)
        index = torch.tensor(slots)
        self.submit(lambda: host.copy_(counts[index]))
        return host, self.mark()

    def gather(self, counts: torch.Tensor, slots: list[int]) -> torch.Tensor:
        host, marker = self.to_host(counts, slots)
        marker.synchronize()
        return host

    def clear(self, counts: torch.Tensor, slots: list[int] | None = None) -> None:
        if slots is None:
            self.submit(counts.zero_)
        else:
            self.submit(functools.partial(counts.index_fill_, 0, torch.tensor(slots), 0))

    def fold(self, counts: torch.Tensor, source: int, target: int) -> None:
        def work() -> None:
            counts[target] += counts[source]
            counts[source] = 0

        self.submit(work)


class EmulatedDevice(QueuedDevice):
    """The worker thread and its queue (see the module doc); :meth:`close` ends the worker.

    The device keeps its own clock: a batch starts when it is queued and the previous one has ended, and ends
    ``batch_s`` later (later only if its real work takes longer), so a worker thread that gets the GIL late
    makes no batch longer. As a CUDA launch queue does, :meth:`submit` blocks while ``max_queued`` batches wait.
    """

    def __init__(self, batch_s: float, max_queued: int = MAX_QUEUED) -> None:
        self.batch_s = batch_s
        self._items: queue.SimpleQueue[tuple[Callable[[], object] | None, bool, float]] = queue.SimpleQueue()
        self._slots = threading.Semaphore(max_queued)  # one per batch queued and not yet run
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._waits: deque[list[float]] = deque()  # the host's waits [start, end], inf while it waits
        self._batches = self._overran = 0
        self._busy_s = self._idle_s = self._idle_waited_s = 0.0
        self._free_at: float | None = None  # when the latest batch ended, on the device's clock
        self._thread = threading.Thread(target=self._work, name="emulated-device", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], object], batch: bool = False) -> None:
        """Queue ``work`` (a batch takes ``batch_s``); raises what failed on the device."""
        self._raise_failure()
        if batch:
            self._slots.acquire()
        self._items.put((work, batch, time.perf_counter()))

    def drain(self) -> None:
        """Wait until everything queued is done (not counted as a host wait)."""
        self.mark().done.wait()
        self._raise_failure()

    def host_waits(self, done: threading.Event) -> None:
        span = [time.perf_counter(), math.inf]
        with self._lock:
            self._waits.append(span)
        try:
            done.wait()
        finally:
            span[1] = time.perf_counter()
        self._raise_failure()

    def times(self) -> DeviceTimes:
        with self._lock:
            return DeviceTimes(self._batches, self._busy_s, self._idle_s, self._idle_waited_s, self._overran)

    def close(self) -> None:
        self._items.put((None, False, 0.0))
        self._thread.join()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _work(self) -> None:
        while True:
            work, batch, queued = self._items.get()
            if work is None:
                return
            try:
                self._run_batch(work, queued) if batch else work()
            except BaseException as error:  # noqa: BLE001 (surfaces in the host's next call, as a CUDA error does)
                self._failure = self._failure or error
            finally:
                if batch:
                    self._slots.release()

    def _run_batch(self, work: Callable[[], object], queued: float) -> None:
        start = queued if self._free_at is None else max(self._free_at, queued)
        if self._free_at is not None:
            self._idle(self._free_at, start)
        work()
        end = start + self.batch_s
        now = time.perf_counter()
        if now > end:
            self._overran += now - start > self.batch_s  # the real work alone took longer
            end = max(end, now)
        else:
            time.sleep(end - now)
        with self._lock:
            self._busy_s += end - start
            self._batches += 1
        self._free_at = end

    def _idle(self, since: float, until: float) -> None:
        """The device idle from ``since`` to ``until``; waiting for a decision where the host waited meanwhile."""
        with self._lock:
            while self._waits and self._waits[0][1] < since:
                self._waits.popleft()
            self._idle_s += until - since
            if any(begin <= until for begin, _ in self._waits):
                self._idle_waited_s += until - since


class AsyncBody:
    """``body``'s work on a :class:`QueuedDevice` (its ``queue``): a batch body whose calls return at once."""

    def __init__(self, body: BatchBody, device: QueuedDevice) -> None:
        self.body, self.queue = body, device

    @property
    def description(self) -> str:
        return f"{self.body.description}, on an emulated device ({self.queue.batch_s * 1000:g} ms a batch)"

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        self.queue.drain()
        return self.body.allocate(num_slots, phase_ids)

    def load(self, slot: int, image: torch.Tensor) -> None:
        self.queue.submit(functools.partial(self.body.load, slot, image))

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        self.queue.submit(functools.partial(self.body.run, slot, index, position, sample), batch=True)

    def finish(self) -> None:
        """After a run: everything queued done, then the body's own finish."""
        self.queue.drain()
        self.body.finish()
