"""What every process of a run opens: the classifier, the data, the images to certify and the
procedure, checked against each other (:func:`open_run`)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from dmae_fast.base.errors import UserError
from dmae_fast.batching.bodies import ResolvedBody, resolve_body
from dmae_fast.batching.classifier import open_classifier, smoothing_sigma
from dmae_fast.batching.job import BatchBody, RowSplit
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stage_timer import StageTimer
from dmae_fast.batching.stream import StreamingCertifier
from dmae_fast.data import TensorImageDataset, open_dataset, subset_indices
from dmae_fast.engines.base import Engine
from dmae_fast.run.config import PROG, CertifyConfig
from dmae_fast.run.reference import Reference, read_reference
from dmae_fast.stats.procedure import Procedure


class _IndexedImages(Dataset):
    """(dataset index, image, label) for the selected indices; load errors travel as text."""

    def __init__(self, dataset: Dataset, indices: list[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> tuple[int, torch.Tensor | None, int | str]:
        index = self.indices[position]
        try:
            image, label = self.dataset[index]
        except UserError as error:  # re-raised in the main process, keeping one line
            return index, None, str(error)
        return index, image, label

def _loader_workers(dataset: Dataset, device: torch.device) -> int:
    """DataLoader processes: 0 for in-memory data; for files 4 beside a GPU, 1 beside a CPU run (decoding one
    image per thousands of forward passes must not take the cores)."""
    if isinstance(dataset, TensorImageDataset):
        return 0
    return 4 if device.type == "cuda" else 1

def _check_compatible(engine: Engine, dataset: Dataset, data: str) -> None:
    spec = engine.spec
    shape = tuple(dataset.image_shape)
    if shape != spec.input_shape:
        hint = " (for DMAE CIFAR-10 models pass --input-size 32)" if shape[1:] == (32, 32) else ""
        raise UserError(f"data {data} has images of shape {shape} but the classifier expects {spec.input_shape}{hint}")
    names = dataset.class_names
    if dataset.num_classes > spec.num_classes or (names is not None and len(names) != spec.num_classes):
        count = len(names) if names is not None else dataset.num_classes
        raise UserError(f"data {data} has {count} classes but the classifier has {spec.num_classes}")

@dataclass(frozen=True)
class OpenedRun:
    """What every process of a run opens: the classifier, the data, the images, the procedure."""

    config: CertifyConfig  # every setting final (sigma and precision resolved): what everything below receives
    engine: Engine
    dataset: Dataset
    indices: list[int]  # every image of the run
    procedure: Procedure
    workers: int  # DataLoader processes
    reference: Reference | None = None  # an incremental run's (``engine``: the derived one, or the pair)

    @property
    def kind(self) -> str:
        return "predict" if self.config.procedure.predict else "certify"

    def images(self, indices: list[int], order: Iterable[int] | None = None) -> Iterator[tuple[int, torch.Tensor, int]]:
        """(index, image, label) of ``indices`` (positions in the order ``order`` hands them out, default all
        in turn), decoded by the DataLoader's workers."""
        loader = DataLoader(_IndexedImages(self.dataset, indices), batch_size=None, num_workers=self.workers,
                            pin_memory=self.engine.device.type == "cuda", sampler=order)
        for index, image, label in loader:
            if image is None:
                raise UserError(label)
            yield index, image, int(label)

    def seeded(self, seed: int) -> OpenedRun:
        """This run with its noise seed resolved."""
        procedure = dataclasses.replace(self.config.procedure, seed=seed)
        return dataclasses.replace(self, config=dataclasses.replace(self.config, procedure=procedure))

    @property
    def smoothing(self) -> Smoothing:
        """What the run smooths (after :meth:`seeded`: with its seed)."""
        c = self.config
        if c.procedure.sigma is None or c.procedure.seed is None:
            raise ValueError("the run's sigma and seed must be resolved first")
        return Smoothing(self.engine, c.procedure.sigma, c.procedure.seed, c.batch, c.sound)

    def body(self, timer: StageTimer | None = None) -> ResolvedBody:
        return resolve_body(self.smoothing, self.config.body, timer)

    def streamer(self, body: BatchBody, split: RowSplit | None = None) -> StreamingCertifier:
        """The run's streamer: each image's plan, and the classes kept for its votes or its procedure."""
        keep = max(self.config.output.keep_votes or 0, self.procedure.keeps)
        return StreamingCertifier(self.smoothing, self.procedure.plan, body, split, self.procedure.image_plans(), keep)

    def announce(self, images: int, body: ResolvedBody, ranks: str = "") -> None:
        """The start line: what runs, on which body and why."""
        c, plan, plans = self.config, self.procedure.plan, self.procedure.image_plans() or {}
        own = [plans.get(index, plan) for index in self.indices]  # each image's plan (None: no samples)
        totals = {0 if p is None else p.total for p in own}
        up_to = "up to " if plan.looks or len(totals) > 1 else ""
        print(f"{PROG}: {images} images, {up_to}{max(totals):,} samples each, "
              f"{self.procedure.name}, sigma {c.procedure.sigma}, {body.body.description} ({body}), "
              f"seed {c.procedure.seed}, batch {c.batch}{ranks} -> {c.output.out}", file=sys.stderr)

def open_run(config: CertifyConfig, device: str | None = None) -> OpenedRun:
    """Open the classifier (on ``device``, default the config's) and the data, and check they fit. The one
    place a run's settings are resolved: the sigma the classifier records where none is given, the precision
    it runs in; the config returned is the only source of both from here on."""
    classifier, data = config.classifier, config.data
    reference = read_reference(config.procedure.reference) if config.procedure.reference is not None else None
    if reference is not None:
        config = reference.resolve(config)
    device = device or classifier.device
    engine = open_classifier(classifier.engine_path, config.body, device, classifier.precision, classifier.input_size,
                             classifier.normalize)
    config = config.resolved(smoothing_sigma(config.procedure.sigma, engine), engine.precision)
    image_size = data.image_size if data.image_size is not None else engine.spec.input_size
    dataset = open_dataset(data.data, split=data.split, labels=data.labels, image_size=image_size)
    _check_compatible(engine, dataset, data.data)
    indices = subset_indices(len(dataset), data.skip, data.max_images)
    workers = data.workers if data.workers is not None else _loader_workers(dataset, engine.device)
    if reference is None:
        return OpenedRun(config, engine, dataset, indices, Procedure(config.procedure_spec()), workers)
    reference.check_run(config, indices)
    procedure = reference.procedure(config, engine.spec.num_classes)
    return OpenedRun(config, reference.engine(engine, device), dataset, indices, procedure, workers, reference)
