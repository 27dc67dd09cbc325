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

from dmae_fast.batching.body_options import Sound
from dmae_fast.batching.scheduler import BatchBody, Job, batch_rows, phase_ids
from dmae_fast.batching.stream import ImageCounts, checked_image
from dmae_fast.run.ranks import Ranks
from dmae_fast.stats.plan import Decide, SamplingPlan


def share(start: int, end: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous part of rows [start, end) split ``world`` ways (sizes differ by <= 1)."""
    size = end - start
    return start + size * rank // world, start + size * (rank + 1) // world


class SampleShardedCertifier:
    """Counts each image's samples across all ranks; yields the same :class:`ImageCounts` on every rank.

    Rows are laid out and counted as the scheduler does (:class:`~.scheduler.Job`'s rows, a counts
    buffer of every phase in slot 0), only each stage's rows are this rank's share."""

    def __init__(self, body: BatchBody, plan: SamplingPlan, batch_size: int, shape: tuple[int, ...],
                 device: torch.device, ranks: Ranks, sound: Sound | None = None) -> None:
        self.body, self.plan, self.batch_size, self.sound = body, plan, batch_size, sound
        self.shape, self.device, self.ranks = shape, device, ranks
        self.samples = 0  # samples this rank counted

    def run(self, images: Iterable[tuple[int, torch.Tensor, int]],
            decide: Decide | None = None) -> Iterator[ImageCounts]:
        """The counts of each image (``images`` in the same order on every rank), as in
        :meth:`StreamingCertifier.run`; ``decide`` is consulted at the plan's looks."""
        counts = self.body.allocate(1, phase_ids(self.device))
        try:
            for index, image, label in images:
                job = Job(checked_image(index, image, self.shape, self.sound), self.plan, decide, index, int(label))
                job.slot = 0
                self.body.load(0, job.image)
                yield self._certify(job, counts)
        finally:
            self.body.finish()

    def _certify(self, job: Job, counts: torch.Tensor) -> ImageCounts:
        total = np.zeros(tuple(counts.shape[1:]), dtype=np.int64)
        start = 0
        while True:
            self._count_rows(job, *share(start, job.stage_end, self.ranks.rank, self.ranks.world))
            total += self._all_reduced(counts[0])
            counts.zero_()
            counts_so_far = job.counts(total)
            if job.final or job.decide(job.index, counts_so_far, job.stage):
                return ImageCounts(job.index, job.label, counts_so_far)
            start = job.stage_end
            job.stage += 1

    def _count_rows(self, job: Job, lo: int, hi: int) -> None:
        """Run rows [lo, hi) of ``job``'s plan, ``batch_size`` rows at a time."""
        for first in range(lo, hi, self.batch_size):
            job.row, take = first, min(self.batch_size, hi - first)
            self.body.run(*batch_rows(job.segments(take), self.device))
            self.samples += take

    def _all_reduced(self, local: torch.Tensor) -> np.ndarray:
        # NCCL sums device tensors; with gloo (CPU ranks, or ranks sharing one GPU) the counts go by the host
        summed = local.clone() if dist.get_backend() != "gloo" else local.to("cpu", copy=True)
        with self.ranks.reaching_peers():
            dist.all_reduce(summed)
        return summed.cpu().numpy()
