"""The order of the device's work: the body's batches, and the scheduler's copies and clears of the counts
between them, each done after everything queued before it (on CUDA the stream's order; on a CPU everything
is done when called). The scheduler reads and clears counts only through a :class:`DeviceQueue`: the torch
device's :class:`StreamQueue`, or the body's own ``queue`` where it runs its batches elsewhere (an emulated
asynchronous device: :mod:`dmae_fast.bench.async_device`).
"""

from __future__ import annotations

from typing import Protocol

import torch


class Ready(Protocol):
    """Marks work queued on the device (a ``torch.cuda.Event`` is one): done yet, or wait until it is."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class DeviceQueue(Protocol):
    """The scheduler's operations on the counts buffer [slots, phases, classes + 1], in order with the batches."""

    def mark(self) -> Ready | None:
        """What marks the work queued so far complete (None: it is)."""

    def to_host(self, counts: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, Ready | None]:
        """A copy of ``counts[slots]`` on its way to the host, and what marks it complete (None: it is)."""

    def gather(self, counts: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """``counts[slots]`` on the device (for a collective that every process makes at the same point)."""

    def clear(self, counts: torch.Tensor, slots: list[int] | None = None) -> None:
        """Zero ``counts[slots]`` (every slot when None)."""

    def fold(self, counts: torch.Tensor, source: int, target: int) -> None:
        """Add ``counts[source]`` to ``counts[target]`` and zero ``counts[source]``."""


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` copied to ``device`` in stream order without waiting for the device (a plain copy
    from pageable memory synchronizes the stream, and so drains the batches queued on the GPU)."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


class StreamQueue:
    """The torch device's own stream (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event | None:
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    def to_host(self, counts: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """On CUDA a pinned tensor filled asynchronously and the event that marks it complete; on a CPU the copy."""
        snapshot = self.gather(counts, slots)  # advanced indexing copies
        if self.device.type != "cuda":
            return snapshot, None
        host = torch.empty(snapshot.shape, dtype=snapshot.dtype, pin_memory=True)
        host.copy_(snapshot, non_blocking=True)
        return host, self.mark()

    def gather(self, counts: torch.Tensor, slots: list[int]) -> torch.Tensor:
        return counts[to_device(torch.tensor(slots), self.device)]

    def clear(self, counts: torch.Tensor, slots: list[int] | None = None) -> None:
        if slots is None:
            counts.zero_()
        else:
            counts[to_device(torch.tensor(slots), self.device)] = 0

    def fold(self, counts: torch.Tensor, source: int, target: int) -> None:
        counts[target] += counts[source]
        counts[source] = 0


def device_queue(body: object, device: torch.device) -> DeviceQueue:
    """The queue ``body``'s batches run on: its own ``queue`` where it has one, else ``device``'s stream."""
    queue: DeviceQueue | None = getattr(body, "queue", None)
    return queue if queue is not None else StreamQueue(device)
