"""The streaming certifier: the images of a dataset through the one scheduler, in full batches.

:class:`StreamingCertifier` is a loop over an :class:`~dmae_fast.batching.engine_loop.EngineLoop`'s
steps that yields each image's class counts as soon as they are on the host; :class:`PlainBody` is
the plain batch body. The noise does not depend on how rows are packed, so the counts are the same for
any batch size (and equal :class:`~dmae_fast.batching.smooth.Smooth`'s), and a body that fails mid-run
can be replaced by its chain's next body: the images not yet yielded start again on it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from dmae_fast.base.errors import UserError, raise_if_interrupted
from dmae_fast.batching.engine_loop import BatchFailed, EngineLoop
from dmae_fast.batching.job import BatchBody, Job, RowSplit, count, keep_class, zero_counts, zero_kept
from dmae_fast.batching.scheduler import LoopStats
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stage_timer import StageTimer, count_batch, stage
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.stats.plan import Decide, SamplingPlan


@dataclass(frozen=True)
class ImageCounts:
    """The class counts of one finished image: ``counts[i]`` for ``plan.phases[i]``."""

    index: int
    label: int
    counts: np.ndarray  # [len(plan.phases), num_classes] int64
    kept: np.ndarray | None = None  # the classes of its first estimation samples, where the run keeps them


class PlainBody:
    """The plain batch body, for any engine: noisy images ``x[slot] + sigma * eta`` -> ``engine.classify`` ->
    counts (``noise`` default: the smoothing's noise compiled into one kernel); a ``timer`` (``--profile``) times
    the three as front end, body and counting."""

    def __init__(self, smoothing: Smoothing, noise: NoiseSource | None = None,
                 timer: StageTimer | None = None) -> None:
        self.smoothing, self.engine, self.timer = smoothing, smoothing.engine, timer
        self.device, self.shape = self.engine.device, self.engine.spec.input_shape
        self.noise = noise or NoiseSource(self.device, grid=smoothing.grid)
        self._ones = torch.ones(smoothing.batch_size, dtype=torch.int64, device=self.device)
        self._kept: torch.Tensor | None = None

    @property
    def description(self) -> str:
        return f"{self.engine.description}, {self.noise.description}"

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        self._slot_images = torch.zeros((num_slots, *self.shape), device=self.device)
        self._phase_ids = phase_ids
        self._counts = zero_counts(num_slots, len(phase_ids), self.engine.spec.num_classes, self.device)
        return self._counts

    def keep_classes(self, num_slots: int, samples: int) -> torch.Tensor:
        """Also keep each row's class of the first ``samples`` estimation samples of every image."""
        self._kept = zero_kept(num_slots, samples, self.device)
        return self._kept

    def load(self, slot: int, image: torch.Tensor) -> None:
        self._slot_images[slot].copy_(image, non_blocking=True)

    def finish(self) -> None:
        """Nothing to undo after a run."""

    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        """Noise, classify and count one batch of rows (device tensors), without synchronizing (unless timed)."""
        count_batch(self.timer)
        phases = self._phase_ids[position]
        with stage(self.timer, "front end"):
            noisy = self.noise(self._slot_images, slot, self.smoothing.sigma, self.smoothing.seed, index, phases,
                               sample)
        with stage(self.timer, "body"):
            predicted = self.engine.classify_phases(noisy, phases)
        with stage(self.timer, "counting"):
            count(self._counts, slot, position, predicted, self._ones)
            if self._kept is not None:
                keep_class(self._kept, slot, phases, sample, predicted)


class StreamingCertifier:
    """Counts the classes of noisy samples for a stream of images, in full batches.

    ``body`` runs the batches (default: ``smoothing``'s :class:`PlainBody`; a body given must have been built
    for the same ``smoothing``, which checks each image: :meth:`Smoothing.checked`). With ``split``
    (``--shard samples``) this process counts its share of every batch of ``split.world * batch_size`` rows,
    and all processes yield the same counts. ``plans``: an image's own plan by index where it differs from ``plan``
    (None: no samples; incremental CERTIFY's). ``keep``: also yield each image's classes of its first ``keep``
    estimation samples (a body with ``keep_classes``; plans without looks). ``samples``: the noisy samples this
    process counted so far; :meth:`stats`: the engine loop's.
    """

    _loop: EngineLoop | None = None  # the current run's (after a body failed: the latest body's)

    def __init__(self, smoothing: Smoothing, plan: SamplingPlan, body: BatchBody | None = None,
                 split: RowSplit | None = None, plans: Mapping[int, SamplingPlan | None] | None = None,
                 keep: int = 0) -> None:
        self.smoothing, self.plan, self.split, self.keep = smoothing, plan, split, keep
        self.plans = plans or {}  # an image's own plan where it has one (None: no samples, its counts empty)
        self.body = body or PlainBody(smoothing)
        if getattr(self.body, "smoothing", smoothing) != smoothing:  # a wrapped body may not say
            raise ValueError("the body was built for another smoothing than the streamer's")
        self.device = smoothing.engine.device
        self.samples = 0
        # the batch the schedule packs: every process's rows together
        self.schedule_batch = smoothing.batch_size * (split.world if split is not None else 1)
        # At most ceil(B / stage) + 1 images meet in one batch and one carries over; in
        # sequential mode as many again may wait for the host's decision.
        every = {plan, *(p for p in self.plans.values() if p is not None)}
        shortest = min(min(np.diff((0,) + p.stage_ends)) for p in every)
        per_batch = math.ceil(self.schedule_batch / shortest) + 2
        self.num_slots = per_batch * (2 if any(p.looks for p in every) else 1)
        if keep and any(p.looks for p in every):
            raise ValueError("classes are kept only for plans without looks")

    def run(self, images: Iterable[tuple[int, torch.Tensor, int]],
            decide: Decide | None = None) -> Iterator[ImageCounts]:
        """Yield each image's counts as soon as they are on the host: in input order without looks (an image
        whose plan is None with no counts, once the images before it are yielded); with looks, ``decide`` is
        called at each look with the counts so far and images that stop early free their slot. A batch that fails
        moves the run to the body's next body, or raises."""
        if decide is None and any(p is not None and p.looks for p in (self.plan, *self.plans.values())):
            raise ValueError("a plan with looks needs a decide callback")
        source = iter(images)
        restarted: deque[tuple[int, torch.Tensor, int]] = deque()  # images to start again, first
        unfinished: dict[Job, None] = {}  # the images loaded and not yet yielded, in the order they came
        # images whose plan draws nothing, each yielded after the job loaded before it (None: none)
        unsampled: deque[tuple[ImageCounts, Job | None]] = deque()
        classes = self.smoothing.engine.spec.num_classes

        def unsampled_due() -> Iterator[ImageCounts]:
            while unsampled and unsampled[0][1] not in unfinished:
                yield unsampled.popleft()[0]

        def next_job() -> Job | None:
            while True:
                item = restarted.popleft() if restarted else next(source, None)
                if item is None:
                    return None
                index, image, label = item
                plan = self.plans.get(index, self.plan)
                if plan is None:
                    empty = np.zeros((0, classes), dtype=np.int64)
                    unsampled.append((ImageCounts(index, int(label), empty), next(reversed(unfinished), None)))
                    continue
                job = Job(self.smoothing.checked(index, image), plan, decide, index=index, label=int(label))
                unfinished[job] = None
                return job

        try:
            loop = self._new_loop(next_job)
            while loop.busy:
                finished = loop.step()
                raise_if_interrupted()
                failed = next((result for _, result in finished if isinstance(result, BatchFailed)), None)
                if failed is not None:  # the next body, or raised; every image not yet yielded starts again
                    self._replace_body(failed.error)
                    loop = self._new_loop(next_job)
                    restarted.extendleft(reversed([(job.index, job.image, job.label) for job in unfinished]))
                    unfinished.clear()
                    continue
                for job, counts in finished:
                    if isinstance(counts, BaseException):
                        raise counts
                    del unfinished[job]
                    yield ImageCounts(job.index, job.label, counts, job.kept)
                    yield from unsampled_due()
                yield from unsampled_due()
            yield from (counts for counts, _ in unsampled)  # the loop is done: every job before them was yielded
        finally:
            self.body.finish()

    def _new_loop(self, next_job: Callable[[], Job | None]) -> EngineLoop:
        self._loop = EngineLoop(self.body, self.device, self.schedule_batch, self.num_slots, source=next_job,
                                on_batch=self._counted, split=self.split, keep=self.keep)
        return self._loop

    def stats(self) -> LoopStats:
        """The engine loop's statistics of the current or latest run (all zero before one)."""
        return self._loop.stats() if self._loop is not None else LoopStats(0, 0)

    def _counted(self, rows: int, seconds: float) -> None:
        self.samples += rows

    def _replace_body(self, error: Exception) -> None:
        """After ``error`` in a batch: the body's next body (said in one line), unless the error is
        the user's, a signal's that surfaced as another error, the body has no chain, or the batches
        are split between processes (which must all run the same schedule)."""
        raise_if_interrupted()
        chain = getattr(self.body, "chain", None)
        if isinstance(error, UserError) or chain is None or self.split is not None:
            raise error
        failed, self.body = self.body, chain.replace(error)
        failed.finish()
