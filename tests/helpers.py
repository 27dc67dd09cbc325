"""What many test files need: a results file's rows without a column (its run time, by default), a tiny
seeded random classifier (as a model, a CPU engine or a checkpoint), seeded random images, and the
streaming certifier's counts."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from dmae_fast.batching.job import BatchBody, RowSplit
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import ImageCounts, StreamingCertifier
from dmae_fast.bench.async_device import QueuedDevice
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.checkpoints import save_classifier
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.model.config import ClassifierSpec, EncoderConfig
from dmae_fast.serve.receipt import read_receipt
from dmae_fast.stats.plan import Decide, SamplingPlan
from dmae_fast.stats.procedure import Procedure

Item = tuple[int, torch.Tensor, int]  # (image index, image, label), what StreamingCertifier.run takes


def rows_without(path: str | Path, column: str = "time", sort: bool = False) -> list[list[str]]:
    """Every line of the results file ``path`` as cells, the header first, without ``column`` (found by its
    name in the header); ``sort``: the rows after the header in ``idx`` order, each ``idx`` once."""
    lines = [line.split("\t") for line in Path(path).read_text(encoding="utf-8").splitlines()]
    drop = lines[0].index(column)
    cells = [line[:drop] + line[drop + 1:] for line in lines]
    if not sort:
        return cells
    rows = sorted(cells[1:], key=lambda row: int(row[0]))
    assert len({row[0] for row in rows}) == len(rows), "an image appears twice"
    return [cells[0], *rows]


def tiny_vit(width: int = 32, depth: int = 2, heads: int = 2, patch: int = 4, size: int = 16, classes: int = 10,
             input_size: int | None = None, seed: int = 0, **spec_fields: Any) -> SmoothingClassifier:
    """A random ViT classifier in eval mode, its weights drawn after ``torch.manual_seed(seed)``; ``input_size``
    (default ``size``) and ``spec_fields`` (mean, std, sigma, pool, ...) go to its ClassifierSpec."""
    torch.manual_seed(seed)
    encoder = EncoderConfig(width, depth, heads, patch_size=patch, img_size=size)
    spec = ClassifierSpec(encoder, num_classes=classes, input_size=input_size or size, **spec_fields)
    return SmoothingClassifier(spec).eval()


def tiny_engine_of(precision: str = "fp32", device: torch.device | str = "cpu", **vit: Any) -> TorchEngine:
    """:func:`tiny_vit` (``vit``: its arguments) in a TorchEngine, on the CPU by default."""
    return TorchEngine(tiny_vit(**vit), torch.device(device), precision)


def tiny_checkpoint(path: str | Path, classes: int = 10, input_size: int = 8, sigma: float = 0.25) -> Path:
    """A one-block :func:`tiny_vit` for 8x8 images (seed 0) saved at ``path``; the global RNG is left as it was."""
    with torch.random.fork_rng():
        model = tiny_vit(depth=1, size=8, classes=classes, input_size=input_size, sigma=sigma)
    return save_classifier(model, path)


def random_images(count: int, size: int = 16, step: int = 1, first: int = 0, seed: int = 1) -> list[Item]:
    """``count`` uniform random 3 x size x size images from a generator seeded ``seed``: image ``i`` has the
    index ``first + step * i`` and the label ``i % 10``."""
    generator = torch.Generator().manual_seed(seed)
    return [(first + step * i, torch.rand((3, size, size), generator=generator), i % 10) for i in range(count)]


def stream(smoothing: Smoothing, items: Iterable[Item], plan: SamplingPlan, body: BatchBody | None = None,
           decide: Decide | None = None, split: RowSplit | None = None) -> list[ImageCounts]:
    """What ``StreamingCertifier(smoothing, plan, body, split).run(items, decide)`` yields, in the order it came."""
    return list(StreamingCertifier(smoothing, plan, body, split).run(items, decide))


def stream_counts(*args: Any, **kwargs: Any) -> dict[int, np.ndarray]:
    """:func:`stream`'s (same arguments) counts by image index."""
    return {done.index: done.counts for done in stream(*args, **kwargs)}


def stacked_counts(*args: Any, **kwargs: Any) -> np.ndarray:
    """:func:`stream`'s (same arguments) counts in the order they came, stacked: [images, phases, classes]."""
    return np.stack([done.counts for done in stream(*args, **kwargs)])


class LazyDevice(QueuedDevice):
    """Runs queued work, in order, only when the host waits for it (or drains): every copy of counts is still on
    its way when the next batch is packed, so the schedule is the same on every run, rows always run ahead of
    decisions and past looks in spare slots."""

    batch_s = 0.0

    def __init__(self) -> None:
        self._items: deque[Callable[[], object]] = deque()

    def submit(self, work: Callable[[], object], batch: bool = False) -> None:
        self._items.append(work)

    def host_waits(self, done: threading.Event) -> None:
        while not done.is_set():
            self._items.popleft()()

    def drain(self) -> None:
        while self._items:
            self._items.popleft()()


def procedure_of(receipt: dict) -> Procedure:
    """The procedure a served answer's receipt records."""
    return Procedure(read_receipt(receipt).spec)


class Run(NamedTuple):
    """A command's exit status and what it printed."""

    rc: int
    out: str
    err: str


def run_command(main: Callable[[list[str]], int], capsys: Any, *args: object) -> Run:
    """``main`` (a command's entry point) run in-process on ``args`` (as strings), with what it printed."""
    capsys.readouterr()  # drop anything captured before
    rc = main([str(a) for a in args])
    captured = capsys.readouterr()
    return Run(rc, captured.out, captured.err)


def one_line_error(run: Run, prog: str, *mentions: str) -> str:
    """The one error line of a refused command: exit 2, nothing on stdout, a single ``prog: error:`` line on stderr
    (no traceback) that names each of ``mentions``."""
    lines = run.err.strip().splitlines()
    assert run.rc == 2 and run.out == "" and "Traceback" not in run.err, run
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), run.err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]
