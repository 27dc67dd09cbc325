"""The streaming certifier: full batches packed from many images, counts on the device.

Each image needs a fixed list of noisy samples (its *plan*: e.g. n0 selection then n
estimation samples). The samples of all images are laid end to end and cut into batches
of exactly ``batch_size`` rows, so a batch mixes the tail of one image with the head of
the next and never runs half empty (only the very last batch of a run can be short).

A row is (slot, phase, sample index): the slot holds the clean image on the device, the
noise is the contract's pure function of (seed, image index, phase, sample index), and
the predicted class is added to ``counts[slot, phase, class]`` on the device. The host
knows from the schedule alone when an image's last row has been issued; it then takes a
device-side snapshot of that image's counts, frees the slot, and copies the snapshot
back asynchronously. Nothing waits for the device per batch.

Because the noise does not depend on how rows are packed, the counts are identical for
any batch size (and equal to :class:`dmae_fast.certification.core.Smooth`'s).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dmae_fast.engines.base import Engine
from dmae_fast.errors import UserError
from dmae_fast.noise import MASK32, Phase, gaussian_noise


@dataclass(frozen=True)
class SamplingPlan:
    """The noisy samples every image gets: ``sizes[i]`` samples of ``phases[i]``."""

    phases: tuple[Phase, ...]
    sizes: tuple[int, ...]

    @classmethod
    def certify(cls, n0: int, n: int) -> SamplingPlan:
        return cls((Phase.SELECTION, Phase.ESTIMATION), (n0, n))

    @classmethod
    def predict(cls, n: int) -> SamplingPlan:
        return cls((Phase.PREDICTION,), (n,))

    @property
    def total(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class ImageCounts:
    """The class counts of one finished image: ``counts[i]`` for ``plan.phases[i]``."""

    index: int
    label: int
    counts: np.ndarray  # [len(plan.phases), num_classes] int64


@dataclass
class _Segment:
    """Consecutive rows of one image and phase in a batch."""

    slot: int
    index: int
    phase_position: int
    first_sample: int
    count: int


class StreamingCertifier:
    """Counts the classes of noisy samples for a stream of images, in full batches."""

    def __init__(self, engine: Engine, plan: SamplingPlan, sigma: float, seed: int, batch_size: int) -> None:
        self.engine, self.plan = engine, plan
        self.sigma, self.seed, self.batch_size = sigma, seed, batch_size
        self.device = engine.device
        self.shape = engine.spec.input_shape
        # At most ceil(B / total) + 1 images meet in one batch; one more carries over.
        self.num_slots = math.ceil(batch_size / plan.total) + 2
        self._starts = np.cumsum((0,) + plan.sizes)

    def run(self, images: Iterable[tuple[int, torch.Tensor, int]]) -> Iterator[ImageCounts]:
        """Yield each image's counts as soon as they are on the host, in input order."""
        classes = self.engine.spec.num_classes
        phases = len(self.plan.phases)
        slot_images = torch.zeros((self.num_slots, *self.shape), device=self.device)
        counts = torch.zeros((self.num_slots, phases, classes), dtype=torch.int64, device=self.device)
        ones = torch.ones(self.batch_size, dtype=torch.int64, device=self.device)
        phase_ids = torch.tensor([int(p) for p in self.plan.phases], device=self.device)
        free = deque(range(self.num_slots))
        source = iter(images)
        current: tuple[int, int, int] | None = None  # (slot, image index, next row)
        labels: dict[int, int] = {}
        in_flight: deque[tuple[list[int], torch.Tensor, torch.cuda.Event | None]] = deque()
        while True:
            segments: list[_Segment] = []
            finished: list[tuple[int, int]] = []  # (image index, slot)
            room = self.batch_size
            while room:
                if current is None:
                    item = next(source, None)
                    if item is None:
                        break
                    current = (self._load(item, slot_images, free, labels), item[0], 0)
                slot, index, row = current
                take = min(room, self.plan.total - row)
                segments += self._segments(slot, index, row, take)
                room -= take
                current = (slot, index, row + take)
                if row + take == self.plan.total:
                    finished.append((index, slot))
                    current = None
            if not segments:
                break
            self._run_batch(segments, slot_images, counts, ones, phase_ids)
            if finished:
                in_flight.append(self._snapshot(finished, counts))
                free.extend(slot for _, slot in finished)  # reused by later batches only
            yield from self._ready(in_flight, labels, wait=False)
        yield from self._ready(in_flight, labels, wait=True)

    def _load(self, item: tuple[int, torch.Tensor, int], slot_images: torch.Tensor, free: deque, labels: dict) -> int:
        index, image, label = item
        if tuple(image.shape) != self.shape:
            raise UserError(f"image {index} has shape {tuple(image.shape)}, the classifier expects {self.shape}")
        if not 0 <= index <= MASK32:
            raise UserError(f"image index {index} outside the noise contract's range [0, 2**32)")
        if image.device.type == "cpu" and not torch.isfinite(image).all():
            raise UserError(f"image {index} contains NaN or infinite pixel values")
        slot = free.popleft()
        slot_images[slot].copy_(image, non_blocking=True)
        labels[index] = int(label)
        return slot

    def _segments(self, slot: int, index: int, row: int, take: int) -> list[_Segment]:
        """Split rows [row, row + take) of an image's plan at phase boundaries."""
        out = []
        for position, (start, end) in enumerate(zip(self._starts[:-1], self._starts[1:])):
            lo, hi = max(row, start), min(row + take, end)
            if lo < hi:
                out.append(_Segment(slot, index, position, int(lo - start), int(hi - lo)))
        return out

    def _run_batch(self, segments, slot_images, counts, ones, phase_ids) -> None:
        """Noise, classify and count one batch, all on the device (no synchronization)."""
        lengths = torch.tensor([s.count for s in segments])
        columns = torch.tensor([[s.slot, s.index, s.phase_position, s.first_sample] for s in segments])
        per_row = torch.repeat_interleave(columns, lengths, dim=0)
        offsets = torch.arange(len(per_row)) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        per_row[:, 3] += offsets
        if self.device.type == "cuda":
            per_row = per_row.pin_memory()
        slot, index, position, sample = per_row.to(self.device, non_blocking=True).unbind(1)
        noise = gaussian_noise(self.seed, index, phase_ids[position], sample, self.shape)
        predicted = self.engine.classify(slot_images[slot] + self.sigma * noise)
        flat = (slot * counts.shape[1] + position) * counts.shape[2] + predicted
        counts.view(-1).index_add_(0, flat, ones[: len(flat)])

    def _snapshot(self, finished: list[tuple[int, int]], counts: torch.Tensor):
        """Copy the finished images' counts off their slots, zero them, start the transfer."""
        indices = [index for index, _ in finished]
        slots = torch.tensor([slot for _, slot in finished], device=self.device)
        snapshot = counts[slots]  # advanced indexing copies, in stream order
        counts[slots] = 0
        if self.device.type != "cuda":
            return indices, snapshot, None
        host = torch.empty(snapshot.shape, dtype=snapshot.dtype, pin_memory=True)
        host.copy_(snapshot, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return indices, host, event

    @staticmethod
    def _ready(in_flight: deque, labels: dict, wait: bool) -> Iterator[ImageCounts]:
        while in_flight and (wait or in_flight[0][2] is None or in_flight[0][2].query()):
            finished, host, event = in_flight.popleft()
            if event is not None:
                event.synchronize()
            for index, image_counts in zip(finished, host.numpy()):
                yield ImageCounts(index, labels.pop(index), image_counts.copy())
