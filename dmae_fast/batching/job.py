"""One image to sample (:class:`Job`), its rows as a batch body takes them (:func:`batch_rows`), what a
batch body is (:class:`BatchBody`) and the counts buffer every body fills (:func:`zero_counts`, :func:`count`):
[slots, phases, classes + 1], the last column the samples whose logits were not finite
(:func:`~dmae_fast.engines.base.predicted_classes` counts them there, :func:`~dmae_fast.stats.decisions.finite_counts`
refuses them). A run may also keep each image's classes of its first estimation samples (:func:`keep_class`: a
:class:`BatchBody`'s optional ``keep_classes``), for incremental certification's votes. :class:`RowSplit`: how the
processes of ``--shard samples`` share each batch's rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dmae_fast.batching.device_queue import to_device
from dmae_fast.stats.decisions import finite_counts
from dmae_fast.stats.plan import Decide, Phase, SamplingPlan

PHASES = (Phase.SELECTION, Phase.ESTIMATION, Phase.PREDICTION)  # a phase's position in the counts = its value
Segment = tuple[int, int, int, int, int]  # consecutive rows: (slot, image index, phase, first sample, count)


def phase_ids(device: torch.device) -> torch.Tensor:
    """The phases of the counts buffer, in position order (a phase's position is its value)."""
    return torch.tensor([int(phase) for phase in PHASES], device=device)


def zero_counts(num_slots: int, num_phases: int, num_classes: int, device: torch.device) -> torch.Tensor:
    """Counts [slots, phases, num_classes + 1]: the last column counts samples with non-finite logits."""
    return torch.zeros((num_slots, num_phases, num_classes + 1), dtype=torch.int64, device=device)


def zero_kept(num_slots: int, samples: int, device: torch.device) -> torch.Tensor:
    """Kept classes [slots, samples + 1]: class + 1 of estimation sample s at column s (0: not drawn yet), the last
    column a sink for the rows not kept."""
    return torch.zeros((num_slots, samples + 1), dtype=torch.int64, device=device)


def keep_class(kept: torch.Tensor, slot: torch.Tensor, phases: torch.Tensor, sample: torch.Tensor,
               predicted: torch.Tensor) -> None:
    """kept[slot, sample] = predicted + 1 for the rows of the first ``kept.shape[1] - 1`` estimation samples, on the
    device without a host sync (the other rows write the sink column)."""
    samples = kept.shape[1] - 1
    column = torch.where((phases == int(Phase.ESTIMATION)) & (sample < samples), sample, samples)
    kept.view(-1).index_put_((slot * kept.shape[1] + column,), predicted + 1)


def count(counts: torch.Tensor, slot: torch.Tensor, position: torch.Tensor, predicted: torch.Tensor,
          ones: torch.Tensor) -> None:
    """counts[slot, position, predicted] += 1 for every row, on the device (one index_add_)."""
    flat = (slot * counts.shape[1] + position) * counts.shape[2] + predicted
    counts.view(-1).index_add_(0, flat, ones[: len(flat)])


class BatchBody(Protocol):
    """What the scheduler needs to run batches (:class:`~.stream.PlainBody` or a fast body)."""

    description: str

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        """Per-run buffers; returns the counts [slots, len(phase_ids), classes + 1] the scheduler reads
        (``phase_ids[position]``: the phase counted at that position; :func:`phase_ids` for a run)."""

    def load(self, slot: int, image: torch.Tensor) -> None: ...

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        """Noise, classify and count one batch of rows (device tensors), without synchronizing;
        ``position``: each row's phase as its position in the counts buffer."""

    def finish(self) -> None:
        """Called when a run ends (completed or not): undo run-wide settings."""

    # Optional (a run that keeps classes, :func:`keep_class`, needs it; the plain and fast bodies have it):
    # def keep_classes(self, num_slots: int, samples: int) -> torch.Tensor:
    #     """Also keep each row's class of the first ``samples`` estimation samples: the buffer (:func:`zero_kept`)."""


class Job:
    """One image to sample: its plan and stopping rule, its progress and its slot. ``row``: the rows handed to
    the device so far; ``stage``: the looks decided so far, so the stage whose end is decided next; ``spare``:
    the slot that counts the rows past its look in the batch of the look (None: none)."""

    __slots__ = ("image", "plan", "decide", "index", "label", "row", "stage", "slot", "spare", "kept", "_starts",
                 "_phases")

    def __init__(self, image: torch.Tensor, plan: SamplingPlan, decide: Decide | None = None, index: int = -1,
                 label: int = 0) -> None:
        self.image, self.plan, self.decide = image, plan, decide
        self.index, self.label = index, label
        self.row = self.stage = 0
        self.slot: int | None = None
        self.spare: int | None = None
        self.kept: np.ndarray | None = None  # its kept classes, once it ended (a run that keeps them)
        self._starts = np.cumsum((0,) + plan.sizes)
        self._phases = [int(phase) for phase in plan.phases]  # their rows in the counts buffer

    @property
    def stage_end(self) -> int:
        return self.plan.stage_ends[self.stage]

    @property
    def next_end(self) -> int:
        """The end of the stage after the current one (not at the last stage): as far as rows may run ahead
        while the decision at ``stage_end`` is on its way."""
        return self.plan.stage_ends[self.stage + 1]

    @property
    def final(self) -> bool:
        return self.stage == len(self.plan.stage_ends) - 1

    @property
    def past_next_look(self) -> bool:
        """Whether rows reached the look after the undecided one (whose counts are then on their way too)."""
        return not self.final and self.row == self.next_end

    def segments(self, take: int, slot: int | None = None) -> list[Segment]:
        """Rows [row, row + take) of this image, split at its plan's phase boundaries, counted in ``slot``
        (default: its own)."""
        slot = self.slot if slot is None else slot
        out = []
        for phase, start, end in zip(self._phases, self._starts[:-1], self._starts[1:]):
            lo, hi = max(self.row, start), min(self.row + take, end)
            if lo < hi:
                out.append((slot, self.index, phase, int(lo - start), int(hi - lo)))
        return out

    def counts(self, slot_counts: np.ndarray) -> np.ndarray:
        """This image's rows of a slot's counts [3 phases, classes + 1], in plan order, the
        non-finite column checked and removed (raises UserError when a logit was not finite)."""
        return finite_counts(self.index, slot_counts[self._phases])

    def kept_classes(self, slot_kept: np.ndarray) -> np.ndarray:
        """This image's classes of its first estimation samples, from a slot's kept classes (:func:`zero_kept`): as
        many as were kept or its plan draws."""
        phases = [Phase(phase) for phase in self._phases]
        drawn = self.plan.sizes[phases.index(Phase.ESTIMATION)] if Phase.ESTIMATION in phases else 0
        classes: np.ndarray = slot_kept[:min(drawn, len(slot_kept) - 1)] - 1
        if (classes < 0).any():
            raise RuntimeError(f"image {self.index}: an estimation sample's class was not kept")
        return classes


def batch_rows(segments: list[Segment], device: torch.device,
               part: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
    """Runs of rows (slot, image index, phase position, first sample, count) -> the four per-row
    columns a batch body takes, on ``device`` (copied without blocking the host); only the rows
    [lo, hi) of ``part`` where given."""
    columns = torch.tensor([s[:4] for s in segments], dtype=torch.int64)
    lengths = torch.tensor([s[4] for s in segments])
    per_row = torch.repeat_interleave(columns, lengths, dim=0)
    per_row[:, 3] += torch.arange(len(per_row)) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    if part is not None:
        per_row = per_row[part[0]:part[1]]
    return to_device(per_row, device).unbind(1)


@dataclass(frozen=True)
class RowSplit:
    """How ``world`` processes share each batch: process ``rank`` counts the contiguous ``share`` of its
    rows; ``summed`` turns this process's counts of some slots [k, phases, classes + 1] into every
    process's sum, on the host (a collective: every process calls it at the same point of the schedule)."""

    rank: int
    world: int
    summed: Callable[[torch.Tensor], torch.Tensor]

    def share(self, rows: int) -> tuple[int, int]:
        """This process's rows [lo, hi) of a batch of ``rows`` (the shares' sizes differ by at most one)."""
        return rows * self.rank // self.world, rows * (self.rank + 1) // self.world


def kept_buffer(body: BatchBody, num_slots: int, keep: int) -> torch.Tensor | None:
    """The body's buffer of kept classes (:func:`zero_kept`); None when none are kept."""
    if not keep:
        return None
    keep_classes = getattr(body, "keep_classes", None)
    if keep_classes is None:
        raise ValueError(f"{body.description} does not keep the classes of samples (no keep_classes)")
    kept: torch.Tensor = keep_classes(num_slots, keep)
    return kept
