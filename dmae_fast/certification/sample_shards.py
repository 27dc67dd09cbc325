"""Sample sharding (``--shard samples``): every rank works on the same image, each on a disjoint
share of its noisy samples, and the counts are summed across ranks (all-reduce).

For latency on one input with a huge n: n = 10^6 spread over 8 GPUs. Each stage of the image's
plan (the selection samples, then the estimation samples up to each look) is split into
``world`` contiguous ranges of rows; rank r counts its range with the run's batch body, the
counts are all-reduced, and every rank takes the same decision from the same totals. The
noise is a pure function of (seed, image, phase, sample), so the summed counts are exactly
those of one process counting every sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from dmae_fast.certification.ranks import Ranks
from dmae_fast.certification.scheduler import BatchBody
from dmae_fast.certification.stream import ImageCounts, checked_image
from dmae_fast.stats.decisions import finite_counts
from dmae_fast.stats.plan import Decide, SamplingPlan


def share(start: int, end: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous part of rows [start, end) split ``world`` ways (sizes differ by <= 1)."""
    size = end - start
    return start + size * rank // world, start + size * (rank + 1) // world


class SampleShardedCertifier:
    """Counts each image's samples across all ranks; yields the same :class:`ImageCounts` on every rank."""

    def __init__(self, body: BatchBody, plan: SamplingPlan, batch_size: int, shape: tuple[int, ...],
                 device: torch.device, ranks: Ranks) -> None:
        self.body, self.plan, self.batch_size = body, plan, batch_size
        self.shape, self.device, self.ranks = shape, device, ranks
        self._phase_starts = np.cumsum((0,) + plan.sizes)
        self.samples = 0  # samples this rank counted

    def run(self, images: Iterable[tuple[int, torch.Tensor, int]],
            decide: Decide | None = None) -> Iterator[ImageCounts]:
        """The counts of each image (``images`` in the same order on every rank), as in
        :meth:`StreamingCertifier.run`; ``decide`` is consulted at the plan's looks."""
        phase_ids = torch.tensor([int(p) for p in self.plan.phases], device=self.device)
        counts = self.body.allocate(1, phase_ids)
        try:
            for index, image, label in images:
                self.body.load(0, checked_image(index, image, self.shape))
                yield self._certify(index, int(label), counts, decide)
        finally:
            self.body.finish()

    def _certify(self, index: int, label: int, counts: torch.Tensor, decide: Decide | None) -> ImageCounts:
        total = np.zeros(tuple(counts.shape[1:]), dtype=np.int64)
        start = 0
        last = len(self.plan.stage_ends) - 1
        for stage, end in enumerate(self.plan.stage_ends):
            self._count_rows(index, *share(start, end, self.ranks.rank, self.ranks.world))
            total += self._all_reduced(counts[0])
            counts.zero_()
            counts_so_far = finite_counts(index, total)
            if stage == last or decide(index, counts_so_far, stage):
                return ImageCounts(index, label, counts_so_far)
            start = end
        raise AssertionError("unreachable: the last stage always finishes an image")

    def _count_rows(self, index: int, lo: int, hi: int) -> None:
        """Run plan rows [lo, hi) of image ``index`` in slot 0, ``batch_size`` rows at a time."""
        for first in range(lo, hi, self.batch_size):
            rows = np.arange(first, min(first + self.batch_size, hi))
            position = np.searchsorted(self._phase_starts[1:], rows, side="right")
            sample = rows - self._phase_starts[position]
            columns = [np.zeros_like(rows), np.full_like(rows, index), position, sample]
            self.body.run(*(torch.from_numpy(np.ascontiguousarray(c)).to(self.device) for c in columns))
            self.samples += len(rows)

    def _all_reduced(self, local: torch.Tensor) -> np.ndarray:
        # NCCL sums device tensors; with gloo (CPU ranks, or ranks sharing one GPU) the counts go by the host
        summed = local.clone() if dist.get_backend() != "gloo" else local.to("cpu", copy=True)
        with self.ranks.reaching_peers():
            dist.all_reduce(summed)
        return summed.cpu().numpy()
