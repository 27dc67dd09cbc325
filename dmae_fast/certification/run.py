"""One certification run as a library call: what ``dmae-certify`` does, without the parser.

    from dmae_fast.certification.run import CertifyConfig, certify_dataset
    result = certify_dataset(CertifyConfig(engine="model.safetensors", data="/imagenet/val", out="r.tsv",
                                           sigma=0.5, skip=50), on_row=print)

Validation, the output lock, resume checks, opening the engine and the data, the choice of
procedure and batch body, writing rows and the run record, and profiling live here; the
command (:mod:`dmae_fast.cli.certify`) parses arguments into a :class:`CertifyConfig`, calls
:func:`certify_dataset` and prints the summary. Started by ``torchrun`` with more than one
process, the same call runs one rank of a multi-process run
(:mod:`dmae_fast.certification.distributed_run`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from dmae_fast import __version__
from dmae_fast.certification.bodies import batch_body
from dmae_fast.certification.choices import PROG
from dmae_fast.certification.config import MAX_BATCH, CertifyConfig  # noqa: F401 (MAX_BATCH: importers of run)
from dmae_fast.certification.fast_stream import StageTimer
from dmae_fast.certification.parts import (
    clear_parts,
    has_parts,
    merge_parts,
    parts_dir,
    replaces_out,
)
from dmae_fast.certification.procedures import Procedure, Row, procedure_for
from dmae_fast.certification.ranks import restart_count, world_size
from dmae_fast.certification.stream import BatchBody, ImageCounts, StreamingCertifier
from dmae_fast.data import TensorImageDataset, open_dataset, subset_indices
from dmae_fast.engines import Engine, EngineOptions, open_engine
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX, read_sidecar
from dmae_fast.errors import Interrupted, UserError
from dmae_fast.integrity import file_sha256
from dmae_fast.locking import OutputLock
from dmae_fast.memory import keep_freed_memory
from dmae_fast.model.config import parse_normalization
from dmae_fast.results import Mode, ResultsWriter, read_kept_rows
from dmae_fast.resume import check_kept_rows, dataset_labels

# Settings that change the results: a resumed run must agree on all of them.
RESULT_FIELDS = ("engine", "data", "split", "labels", "image_size", "input_size", "normalize",
                 "sigma", "n0", "n", "alpha", "seed", "predict", "skip", "max_images", "precision",
                 "sequential", "looks", "futility")


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


def load_images(dataset: Dataset, indices: list[int], workers: int, pin: bool,
                order: Iterable[int] | None = None) -> Iterator[tuple[int, torch.Tensor, int]]:
    """(index, image, label) of ``indices`` (positions in the order ``order`` hands them out, default
    all in turn), decoded by ``workers`` DataLoader processes."""
    loader = DataLoader(_IndexedImages(dataset, indices), batch_size=None, num_workers=workers, pin_memory=pin,
                        sampler=order)
    for index, image, label in loader:
        if image is None:
            raise UserError(label)
        yield index, image, int(label)


def _loader_workers(dataset: Dataset, device: torch.device) -> int:
    """DataLoader processes: none for in-memory data; for image files 4 beside a GPU, 1 beside a
    CPU run (decoding one image per thousands of forward passes must not take the cores)."""
    if isinstance(dataset, TensorImageDataset):
        return 0
    return 4 if device.type == "cuda" else 1


def _check_compatible(engine: Engine, dataset: Dataset, data: str) -> None:
    spec = engine.spec
    shape = tuple(dataset.image_shape)
    if shape != spec.input_shape:
        hint = " (for DMAE CIFAR-10 models pass --input-size 32)" if shape[1:] == (32, 32) else ""
        raise UserError(f"data {data} has images of shape {shape} but the classifier expects "
                        f"{spec.input_shape}{hint}")
    names = dataset.class_names
    if dataset.num_classes > spec.num_classes or (names is not None and len(names) != spec.num_classes):
        count = len(names) if names is not None else dataset.num_classes
        raise UserError(f"data {data} has {count} classes but the classifier has {spec.num_classes}")


def _check_out_directory(out: Path) -> None:
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; name a results file")
    if not out.parent.is_dir():
        raise UserError(f"directory of --out {out} does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write --out {out}: directory {out.parent} is not writable")


def kept_after_interrupt(config: CertifyConfig, mode: str, finished: int) -> str:
    """What an interrupted run leaves on disk, and how to continue."""
    if mode == "overwrite":
        return (f"{config.out} is unchanged; this run's rows ({finished}) are in {config.out}.partial "
                "(not resumable: run again with --overwrite)")
    kept = "1 new row is" if finished == 1 else f"{finished} new rows are"
    return (f"{kept} in {config.out} (run record marked interrupted); continue with the same "
            "command and --resume")


def output_mode(config: CertifyConfig) -> Mode:
    """How this run treats ``--out``: "new", "append" (--resume, or a torchrun restart of this job)
    or "overwrite"; refuses what it must not touch."""
    out = Path(config.out)
    _check_out_directory(out)
    restarted = restart_count() > 0
    if config.resume or (restarted and not config.overwrite):
        if has_parts(out) and replaces_out(out):
            raise UserError(f"{parts_dir(out)} holds rows of an --overwrite run that did not finish; "
                            "run it again with --overwrite")
        if out.exists() or has_parts(out):
            _check_resumable(config)
        return "append"  # a run stopped before its first row: nothing to check, start it
    if out.exists() and not config.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it or --resume to continue it")
    if has_parts(out) and not config.overwrite:
        raise UserError(f"{parts_dir(out)} holds the rows of an unfinished multi-process run on {out}; pass "
                        "--resume to continue it or --overwrite to start over")
    return "overwrite" if config.overwrite else "new"


def _sidecar(config: CertifyConfig) -> Path:
    return Path(config.out + ".json")


def _check_resumable(config: CertifyConfig) -> None:
    sidecar = _sidecar(config)
    try:
        recorded = json.loads(sidecar.read_text())["config"]
    except (OSError, ValueError, KeyError):
        raise UserError(f"--resume needs the run record {sidecar} written beside {config.out}") from None
    current = dataclasses.asdict(config)
    fields = RESULT_FIELDS + (("radii",) if config.sequential else ())
    differing = [k for k in fields if _as_recorded(recorded.get(k)) != _as_recorded(current.get(k))]
    if differing:
        raise UserError(f"--resume: {', '.join(differing)} differ from the run recorded in {sidecar}")


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model and torch's thread count (for run records)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.machine()
    return f"{model}, {torch.get_num_threads()} threads"


def _as_recorded(value):
    """Settings as they read back from JSON (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value


def _profiler(config: CertifyConfig, device: torch.device):
    """A torch profiler over the run when --profile asks for one."""
    if not config.profile:
        return contextlib.nullcontext()
    folder = Path(config.profile)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--profile {folder} is a file; name a directory")
    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities)


def _report_profile(config: CertifyConfig, profiler, timer: StageTimer, elapsed: float) -> None:
    trace = Path(config.profile) / "trace.json"
    profiler.export_chrome_trace(str(trace))
    table = timer.table(elapsed)
    (Path(config.profile) / "stages.txt").write_text(table + "\n")
    print(f"{PROG}: per-stage time (each stage synchronized; trace in {trace}):\n{table}", file=sys.stderr)


def _engine_input(config: CertifyConfig) -> str:
    """"tokens" for a token engine on the fast path (its front end feeds it), else "image"."""
    path = Path(config.engine)
    if config.fast_body and path.suffix in KIND_BY_SUFFIX and path.is_file():
        return read_sidecar(path).input
    return "image"


@dataclass(frozen=True)
class OpenedRun:
    """What every process of a run opens: the classifier, the data, the images, the procedure."""

    config: CertifyConfig  # sigma and precision resolved
    engine: Engine
    dataset: Dataset
    indices: list[int]  # every image of the run
    procedure: Procedure
    workers: int  # DataLoader processes

    @property
    def kind(self) -> str:
        return "predict" if self.config.predict else "certify"

    def images(self, indices: list[int], order: Iterable[int] | None = None) -> Iterator[tuple[int, torch.Tensor, int]]:
        return load_images(self.dataset, indices, self.workers, self.engine.device.type == "cuda", order)

    def body(self, timer: StageTimer | None = None) -> BatchBody:
        c = self.config
        return batch_body(self.engine, c.sigma, c.seed, c.batch, c.body_options, timer)

    def streamer(self, body: BatchBody) -> StreamingCertifier:
        c = self.config
        return StreamingCertifier(self.engine, self.procedure.plan, c.sigma, c.seed, c.batch, body)

    def announce(self, images: int, body: BatchBody, ranks: str = "") -> None:
        c, plan = self.config, self.procedure.plan
        print(f"{PROG}: {images} images, {'up to ' if plan.looks else ''}{plan.total:,} samples each, "
              f"{self.procedure.name}, sigma {c.sigma}, {body.description}, batch {c.batch}{ranks} -> {c.out}"
              + (f" ({c.body_reason})" if c.body_reason else ""), file=sys.stderr)


def open_run(config: CertifyConfig, device: str | None = None) -> OpenedRun:
    """Open the classifier (on ``device``, default ``config.device``) and the data, and check they fit."""
    mean, std = parse_normalization(config.normalize)
    options = EngineOptions(device or config.device, config.precision, config.input_size, mean, std,
                            _engine_input(config))
    engine = open_engine(config.engine, options)
    if config.sigma is None and engine.spec.sigma is None:
        raise UserError("--sigma is required: the checkpoint does not record the sigma it was trained for")
    sigma = config.sigma if config.sigma is not None else engine.spec.sigma
    config = dataclasses.replace(config, sigma=sigma, precision=engine.precision)
    config.validate()  # the sigma the checkpoint or sidecar recorded, like --sigma
    image_size = config.image_size if config.image_size is not None else engine.spec.input_size
    dataset = open_dataset(config.data, split=config.split, labels=config.labels, image_size=image_size)
    _check_compatible(engine, dataset, config.data)
    indices = subset_indices(len(dataset), config.skip, config.max_images)
    workers = config.workers if config.workers is not None else _loader_workers(dataset, engine.device)
    return OpenedRun(config, engine, dataset, indices, procedure_for(config), workers)


def rows_file(config: CertifyConfig, mode: Mode) -> str:
    """Where the rows of this run go: ``--out``, or ``--out.partial`` until an --overwrite run completes."""
    return config.out + ".partial" if mode == "overwrite" else config.out


def images_to_do(opened: OpenedRun, mode: Mode, parts: bool) -> list[int]:
    """The images this run still has to certify, after taking in what is on disk.

    Appending: the parts of an interrupted multi-process run are merged into ``--out`` and the
    kept rows checked. Overwriting: a torchrun restart of this job (with ``parts``) keeps the
    rows its killed attempt left in the parts; otherwise stale parts and partial files go.
    """
    config = opened.config
    target = rows_file(config, mode)
    if mode == "overwrite" and not (parts and restart_count() > 0):
        clear_parts(config.out)
        with contextlib.suppress(FileNotFoundError):
            os.remove(target)
    if mode == "new" or not (has_parts(config.out) or os.path.exists(target)):
        return opened.indices
    if has_parts(config.out):
        merge_parts(config.out, opened.kind, into=target)
    kept = read_kept_rows(target)
    if kept is None:
        return opened.indices
    check_kept_rows(kept, opened.indices, dataset_labels(opened.dataset, opened.indices),
                    opened.procedure.rules(config))
    done = set(kept.idx.tolist())
    return [i for i in opened.indices if i not in done]


class RunRecord:
    """The run record ``<out>.json``: the resolved settings, engine, threads, versions, status."""

    def __init__(self, opened: OpenedRun, body: BatchBody, mode: Mode, extra: dict | None = None) -> None:
        self.opened, self.body, self.mode, self.extra = opened, body, mode, extra or {}
        self.model_sha256 = file_sha256(opened.config.engine)  # names the very file that was certified

    def write(self, summary: dict, final: bool = False) -> None:
        """Write the record; an --overwrite run's old record stays until the new results replace it."""
        if self.mode == "overwrite" and not final:
            return
        opened, procedure = self.opened, self.opened.procedure
        record = {
            "config": dataclasses.asdict(opened.config),
            "procedure": procedure.name,
            "max_radius": procedure.max_radius(opened.config),  # what the summary tables stop at
            "plan": {"phases": [p.name for p in procedure.plan.phases], "sizes": procedure.plan.sizes,
                     "looks": procedure.plan.looks},
            "engine": self.body.description,
            "body_fallbacks": getattr(self.body, "fallbacks", []),
            "model_sha256": self.model_sha256,
            "threads": {"torch_intra_op": torch.get_num_threads(), "dataloader_workers": opened.workers,
                        "body_workers": getattr(self.body, "workers", None)},
            "classifier": opened.engine.spec.to_json_dict(),
            "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()},
            "device_name": device_name(opened.engine.device),
            "host_allocator": keep_freed_memory() if opened.engine.device.type == "cpu" else "unchanged",
            **self.extra,
            **summary,
        }
        _sidecar(opened.config).write_text(json.dumps(record, indent=2, default=str) + "\n")


def progress_bar(config: CertifyConfig, total: int, enabled: bool = True) -> tqdm:
    return tqdm(total=total, unit="img", desc="certifying" if not config.predict else "predicting",
                disable=not (config.progress and enabled), mininterval=0.5, file=sys.stderr)


def show_progress(bar: tqdm, images: int, samples: int, elapsed: float) -> None:
    """Set the bar to ``images`` done at ``samples / elapsed`` noisy samples/s."""
    bar.update(images - bar.n)
    if elapsed > 0:
        bar.set_postfix_str(f"{samples / elapsed:,.0f} samples/s")


@dataclass
class RowWriter:
    """Turns finished images into rows: written to ``writer`` (if any), passed to ``on_row``,
    counted; ``after(samples)`` runs after each (progress, job-wide bookkeeping)."""

    opened: OpenedRun
    writer: ResultsWriter | None
    on_row: Callable[[Row], None]
    after: Callable[[int], None]
    images: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def consume(self, results: Iterator[ImageCounts]) -> None:
        for done in results:
            self.images += 1
            samples = int(done.counts.sum())
            self.samples += samples
            row = self.opened.procedure.row(self.opened.config, done, self.elapsed / self.images)  # the image's share
            if self.writer is not None:
                self.writer.write(row)
            self.on_row(row)
            self.after(samples)

    def figures(self) -> dict:
        elapsed = self.elapsed
        return {"images": self.images, "samples": self.samples, "elapsed_s": round(elapsed, 3),
                "samples_per_s": round(self.samples / elapsed, 1) if elapsed > 0 else None}


@dataclass(frozen=True)
class RunResult:
    """What a completed run did; ``config`` is resolved (sigma and precision as used). In a
    multi-process run, rank 0's result counts the whole job (``primary``), the others' their own."""

    config: CertifyConfig
    images: int
    samples: int
    elapsed_s: float
    samples_per_s: float
    world_size: int = 1
    primary: bool = True


def certify_dataset(config: CertifyConfig, on_row: Callable[[Row], None] | None = None) -> RunResult:
    """Run one certification as configured: open the classifier and the data, check a resumed
    file, stream the images, write each row (and pass it to ``on_row``) as the image finishes,
    keep the run record ``<out>.json``.

    The results file is locked for the whole run: a second run on the same ``out`` is refused.
    Bad input raises :class:`UserError`; SIGINT/SIGTERM (with :func:`interrupt_on_signals`)
    raise :class:`Interrupted` after marking the record, its ``kept`` saying what is on disk.
    Under ``torchrun`` with more than one process this is one rank of a multi-process run
    (:func:`dmae_fast.certification.distributed_run.certify_ranks`); ``on_row`` then sees the
    rows this process certified.
    """
    config.validate()
    on_row = on_row or (lambda row: None)
    if world_size() > 1:
        from dmae_fast.certification.distributed_run import certify_ranks

        return certify_ranks(config, on_row)
    if not (config.resume or restart_count()):
        output_mode(config)  # refuse an existing --out before loading anything
    _check_out_directory(Path(config.out))
    with OutputLock(config.out, "results file"):
        return _certify_locked(config, on_row)


def _certify_locked(config: CertifyConfig, on_row: Callable[[Row], None]) -> RunResult:
    opened = open_run(config)
    config = opened.config
    mode = output_mode(config)
    if mode == "append" and not Path(config.out).exists() and not has_parts(config.out):
        print(f"{PROG}: --resume: {config.out} does not exist yet; starting the run", file=sys.stderr)
    indices = images_to_do(opened, mode, parts=False)
    timer = StageTimer(opened.engine.device) if config.profile else None
    body = opened.body(timer)
    opened.announce(len(indices), body)
    record = RunRecord(opened, body, mode)
    record.write({"status": "running"})
    bar = progress_bar(config, len(indices))
    profiler = _profiler(config, opened.engine.device)
    rows = None
    try:
        with ResultsWriter(config.out, kind=opened.kind, mode=mode) as writer, bar, profiler:
            rows = RowWriter(opened, writer, on_row, lambda samples: show_progress(
                bar, rows.images, rows.samples, rows.elapsed))
            rows.consume(opened.streamer(body).run(opened.images(indices), opened.procedure.decide))
    except Interrupted as stop:
        finished = rows.images if rows else 0
        record.write({"status": "interrupted", "images": finished})
        stop.kept = kept_after_interrupt(config, mode, finished)
        raise
    except UserError as error:
        record.write({"status": "failed", "images": rows.images if rows else 0, "error": str(error)})
        raise
    if mode == "overwrite":
        clear_parts(config.out)  # a stale multi-process run's parts: --out is now this run's
    if timer is not None:
        _report_profile(config, profiler, timer, rows.elapsed)
    figures = rows.figures()
    record.write({"status": "complete", **figures}, final=True)
    return RunResult(config, rows.images, rows.samples, figures["elapsed_s"], figures["samples_per_s"] or math.nan)
