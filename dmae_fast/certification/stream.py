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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dmae_fast.certification.core import finite_counts, zero_counts
from dmae_fast.data import check_finite
from dmae_fast.engines.base import Engine
from dmae_fast.errors import UserError, raise_if_interrupted
from dmae_fast.fast_noise import NoiseSource
from dmae_fast.noise import MASK32, Phase

Decide = Callable[[int, np.ndarray, int], bool]
"""(image index, counts [phases, classes] at look k, k) -> True to stop sampling the image."""


@dataclass(frozen=True)
class SamplingPlan:
    """The noisy samples every image gets: ``sizes[i]`` samples of ``phases[i]``.

    ``looks`` are row offsets inside the plan (0 < look < total) after which the host
    consults a :data:`Decide` callback that may stop the image early (sequential mode).
    """

    phases: tuple[Phase, ...]
    sizes: tuple[int, ...]
    looks: tuple[int, ...] = ()

    @classmethod
    def certify(cls, n0: int, n: int) -> SamplingPlan:
        return cls((Phase.SELECTION, Phase.ESTIMATION), (n0, n))

    @classmethod
    def sequential(cls, n0: int, estimation_looks: tuple[int, ...]) -> SamplingPlan:
        """n0 selection samples, then estimation samples up to the last look."""
        looks = tuple(n0 + look for look in estimation_looks[:-1])
        return cls((Phase.SELECTION, Phase.ESTIMATION), (n0, estimation_looks[-1]), looks)

    @classmethod
    def predict(cls, n: int) -> SamplingPlan:
        return cls((Phase.PREDICTION,), (n,))

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def stage_ends(self) -> tuple[int, ...]:
        return self.looks + (self.total,)


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


@dataclass
class _Image:
    """An image on the device: its slot, the next row to issue, its current stage."""

    index: int
    label: int
    slot: int
    row: int = 0
    stage: int = 0


class ImageBatches:
    """The plain batch body: noisy images ``x[slot] + sigma * eta`` -> ``engine.classify`` -> counts.

    Works with any :class:`Engine`. The noise comes from ``noise`` (default: the contract
    compiled into one kernel, :class:`~dmae_fast.fast_noise.NoiseSource`). The fast bodies
    live in :mod:`dmae_fast.certification.fast_stream` (GPU) and
    :mod:`dmae_fast.certification.cpu_batches` (CPU) and keep this interface.
    """

    def __init__(self, engine: Engine, sigma: float, seed: int, batch_size: int,
                 noise: NoiseSource | None = None) -> None:
        self.engine, self.sigma, self.seed = engine, sigma, seed
        self.device, self.shape = engine.device, engine.spec.input_shape
        self.noise = noise or NoiseSource(engine.device)
        self._ones = torch.ones(batch_size, dtype=torch.int64, device=self.device)

    @property
    def description(self) -> str:
        return f"{self.engine.description}, {self.noise.implementation} noise"

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        """Per-run buffers; returns the counts [slots, phases, classes] the scheduler reads."""
        self._slot_images = torch.zeros((num_slots, *self.shape), device=self.device)
        self._phase_ids = phase_ids
        self._counts = zero_counts(num_slots, len(phase_ids), self.engine.spec.num_classes, self.device)
        return self._counts

    def load(self, slot: int, image: torch.Tensor) -> None:
        self._slot_images[slot].copy_(image, non_blocking=True)

    def finish(self) -> None:
        """Nothing to undo after a run."""

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        """Noise, classify and count one batch of rows (device tensors), without synchronizing."""
        noisy = self.noise(self._slot_images, slot, self.sigma, self.seed, index, self._phase_ids[position], sample)
        predicted = self.engine.classify(noisy)
        count(self._counts, slot, position, predicted, self._ones)


def checked_image(index: int, image: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``image`` if it can be certified as image ``index``: the classifier's shape, an index inside
    the noise contract, finite pixels (checked on the host only: no device synchronisation)."""
    if tuple(image.shape) != shape:
        raise UserError(f"image {index} has shape {tuple(image.shape)}, the classifier expects {shape}")
    if not 0 <= index <= MASK32:
        raise UserError(f"image index {index} outside the noise contract's range [0, 2**32)")
    if image.device.type == "cpu":
        check_finite(image, index)
    return image


def batch_rows(segments: list[tuple[int, int, int, int, int]], device: torch.device) -> tuple[torch.Tensor, ...]:
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


def count(counts: torch.Tensor, slot: torch.Tensor, position: torch.Tensor, predicted: torch.Tensor,
          ones: torch.Tensor) -> None:
    """counts[slot, position, predicted] += 1 for every row, on the device (one index_add_)."""
    flat = (slot * counts.shape[1] + position) * counts.shape[2] + predicted
    counts.view(-1).index_add_(0, flat, ones[: len(flat)])


class BatchBody(Protocol):
    """What the scheduler needs to run batches (:class:`ImageBatches` or a fast body)."""

    description: str

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor: ...

    def load(self, slot: int, image: torch.Tensor) -> None: ...

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None: ...

    def finish(self) -> None:
        """Called when a run ends (completed or not): undo run-wide settings."""


class StreamingCertifier:
    """Counts the classes of noisy samples for a stream of images, in full batches.

    ``body`` runs the batches (default :class:`ImageBatches`); the schedule, and so the
    counts, do not depend on it beyond the classifier's floating-point rounding.
    """

    def __init__(self, engine: Engine, plan: SamplingPlan, sigma: float, seed: int, batch_size: int,
                 body: BatchBody | None = None) -> None:
        self.engine, self.plan = engine, plan
        self.sigma, self.seed, self.batch_size = sigma, seed, batch_size
        self.body = body or ImageBatches(engine, sigma, seed, batch_size)
        self.device = engine.device
        self.shape = engine.spec.input_shape
        self._starts = np.cumsum((0,) + plan.sizes)
        # At most ceil(B / stage) + 1 images meet in one batch and one carries over; in
        # sequential mode as many again may wait for the host's decision.
        shortest = min(np.diff((0,) + plan.stage_ends))
        per_batch = math.ceil(batch_size / shortest) + 2
        self.num_slots = per_batch * (2 if plan.looks else 1)

    def run(self, images: Iterable[tuple[int, torch.Tensor, int]], decide: Decide | None = None) -> Iterator[ImageCounts]:
        """Yield each image's counts as soon as they are on the host.

        Without looks (fixed n) images finish in input order. With looks, ``decide`` is
        called at each look with the counts so far; images that stop early free their
        slot for the next image, so batches stay full.
        """
        if self.plan.looks and decide is None:
            raise ValueError("a plan with looks needs a decide callback")
        phase_ids = torch.tensor([int(p) for p in self.plan.phases], device=self.device)
        self._counts = self.body.allocate(self.num_slots, phase_ids)
        self._free = deque(range(self.num_slots))
        self._ready: deque[_Image] = deque()
        self._waiting: deque[tuple[list[_Image], torch.Tensor, torch.cuda.Event | None]] = deque()
        self._finished: list[ImageCounts] = []
        self._decide = decide
        try:
            yield from self._stream(iter(images))
        finally:
            self.body.finish()

    def _stream(self, source: Iterator[tuple[int, torch.Tensor, int]]) -> Iterator[ImageCounts]:
        """Issue full batches until every image's counts are on the host."""
        exhausted = False
        while True:
            segments: list[_Segment] = []
            reached: list[_Image] = []  # images whose stage ends in this batch
            room = self.batch_size
            while room:
                if not self._ready:
                    if self._free and not exhausted:
                        item = next(source, None)
                        exhausted = item is None
                        if item is not None:
                            self._ready.append(self._load(item))
                    elif self._waiting:
                        self._resolve(wait=True, only_first=True)
                    else:
                        break
                    continue
                image = self._ready[0]
                end = self.plan.stage_ends[image.stage]
                take = min(room, end - image.row)
                segments += self._segments(image.slot, image.index, image.row, take)
                image.row += take
                room -= take
                if image.row == end:
                    reached.append(self._ready.popleft())
            if segments:
                self._run_batch(segments)
                raise_if_interrupted()
            if reached:
                self._snapshot(reached)
            self._resolve(wait=not segments)
            yield from self._finished
            self._finished.clear()
            if not segments and not self._ready and not self._waiting:
                if not exhausted:
                    raise RuntimeError("streaming scheduler stalled with images left")
                break

    def _load(self, item: tuple[int, torch.Tensor, int]) -> _Image:
        index, image, label = item
        image = checked_image(index, image, self.shape)
        slot = self._free.popleft()
        self.body.load(slot, image)
        return _Image(index, int(label), slot)

    def _segments(self, slot: int, index: int, row: int, take: int) -> list[_Segment]:
        """Split rows [row, row + take) of an image's plan at phase boundaries."""
        out = []
        for position, (start, end) in enumerate(zip(self._starts[:-1], self._starts[1:])):
            lo, hi = max(row, start), min(row + take, end)
            if lo < hi:
                out.append(_Segment(slot, index, position, int(lo - start), int(hi - lo)))
        return out

    def _run_batch(self, segments: list[_Segment]) -> None:
        """Hand one batch's rows (slot, image index, phase position, sample) to the body."""
        rows = [(s.slot, s.index, s.phase_position, s.first_sample, s.count) for s in segments]
        self.body.run(*batch_rows(rows, self.device))

    def _snapshot(self, reached: list[_Image]) -> None:
        """Copy the counts of images at a stage end off the device, asynchronously.

        Images at their final stage are done whatever the host says: their slots are
        zeroed and freed at once (in stream order after the copy).
        """
        snapshot, event = counts_to_host(self._counts, [image.slot for image in reached])
        final = [image for image in reached if image.stage == len(self.plan.stage_ends) - 1]
        self._release(final)
        self._waiting.append((reached, snapshot, event))

    def _release(self, images: list[_Image]) -> None:
        if images:
            self._counts[torch.tensor([image.slot for image in images], device=self.device)] = 0
            self._free.extend(image.slot for image in images)

    def _resolve(self, wait: bool, only_first: bool = False) -> None:
        """Act on snapshots that reached the host: finish images or schedule their next stage."""
        last_stage = len(self.plan.stage_ends) - 1
        while self._waiting and (wait or self._waiting[0][2] is None or self._waiting[0][2].query()):
            reached, host, event = self._waiting.popleft()
            if event is not None:
                event.synchronize()
            stopped = []
            for image, image_counts in zip(reached, host.numpy()):
                done = image.stage == last_stage or self._decide(image.index, finite_counts(image.index, image_counts),
                                                                 image.stage)
                if done:
                    self._finished.append(ImageCounts(image.index, image.label, finite_counts(image.index, image_counts)))
                    if image.stage != last_stage:
                        stopped.append(image)
                else:
                    image.stage += 1
                    self._ready.append(image)
            self._release(stopped)
            if only_first:
                return
