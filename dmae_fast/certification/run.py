"""One certification run as a library call: what ``dmae-certify`` does, without the parser.

    from dmae_fast.certification.run import CertifyConfig, certify_dataset
    result = certify_dataset(CertifyConfig(engine="model.safetensors", data="/imagenet/val", out="r.tsv",
                                           sigma=0.5, skip=50), on_row=print)

Validation, the output lock, resume checks, opening the engine and the data, the choice of
procedure and batch body, writing rows and the run record, and profiling live here; the
command (:mod:`dmae_fast.cli.certify`) parses arguments into a :class:`CertifyConfig`, calls
:func:`certify_dataset` and prints the summary.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from dmae_fast import __version__
from dmae_fast.certification.bodies import NOISE_CHOICES, BodyOptions, batch_body
from dmae_fast.certification.core import (
    FIXED_N,
    Certificate,
    certify_from_counts,
    predict_from_counts,
)
from dmae_fast.certification.fast_stream import StageTimer
from dmae_fast.certification.sequential import (
    PAPER_RADII,
    SequentialCertifier,
    SequentialConfig,
)
from dmae_fast.certification.stream import (
    BatchBody,
    Decide,
    ImageCounts,
    SamplingPlan,
    StreamingCertifier,
)
from dmae_fast.data import TensorImageDataset, open_dataset, subset_indices
from dmae_fast.engines import Engine, EngineOptions, open_engine
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX, read_sidecar
from dmae_fast.errors import Interrupted, UserError
from dmae_fast.locking import OutputLock
from dmae_fast.model.config import parse_normalization, sigma_problem
from dmae_fast.results import (
    CertifyRow,
    PredictRow,
    ResultsWriter,
    read_kept_rows,
)
from dmae_fast.resume import RowRules, check_kept_rows, dataset_labels

PROG = "dmae-certify"
MAX_BATCH = 2**20  # noisy samples per forward pass; far beyond any device's memory at 224x224
# Settings that change the results: a resumed run must agree on all of them.
RESULT_FIELDS = ("engine", "data", "split", "labels", "image_size", "input_size", "normalize",
                 "sigma", "n0", "n", "alpha", "seed", "predict", "skip", "max_images", "precision",
                 "sequential", "looks", "futility")


@dataclass(frozen=True)
class CertifyConfig:
    """One certification run (the command line, resolved)."""

    engine: str
    data: str
    out: str
    sigma: float | None  # None: the sigma the checkpoint records
    n0: int = 100
    n: int = 10_000
    alpha: float = 0.001
    batch: int = 1000
    skip: int = 1
    max_images: int | None = None
    seed: int = 0
    predict: bool = False
    sequential: bool = False
    looks: tuple[int, ...] | None = None
    futility: str = "deterministic"
    split: str = "test"
    labels: str | None = None
    image_size: int | None = None
    input_size: int | None = None
    normalize: str | None = None
    device: str = "auto"
    precision: str = "auto"
    workers: int | None = None
    overwrite: bool = False
    resume: bool = False
    radii: tuple[float, ...] | None = None  # summary radii; radii of interest with --sequential
    progress: bool = True
    fast: bool = False  # the fastest body for the device (CPU: cpu_batches; CUDA: the three below)
    fused: bool = False  # fast path: Triton noise + patch embedding
    compile: bool = False  # fast path: torch.compile the body
    cuda_graphs: bool = False  # fast path: capture and replay each batch
    noise: str = "compiled"  # or "reference": the torch-op noise
    profile: str | None = None  # directory for a torch profiler trace + per-stage table

    @property
    def body_options(self) -> BodyOptions:
        return BodyOptions(fast=self.fast, fused=self.fused, compile=self.compile, cuda_graphs=self.cuda_graphs,
                           noise=self.noise)

    @property
    def fast_body(self) -> bool:
        """Whether a fast body (not the plain one) may run: token engines need one."""
        return self.fast or self.fused or self.compile or self.cuda_graphs or self.profile is not None

    def validate(self) -> None:
        checks = [
            (self.sigma is None or sigma_problem(self.sigma) is None, f"--{sigma_problem(self.sigma)}"),
            (self.image_size is None or self.image_size >= 1, f"--image-size must be >= 1, got {self.image_size}"),
            (self.input_size is None or self.input_size >= 1, f"--input-size must be >= 1, got {self.input_size}"),
            (0 < self.alpha < 1, f"--alpha must be in (0, 1), got {self.alpha}"),
            (self.n0 >= 1, f"--n0 must be >= 1, got {self.n0}"),
            (1 <= self.n < 2**32, f"--n must be in [1, 2**32), got {self.n}"),
            (1 <= self.batch <= MAX_BATCH, f"--batch must be in [1, {MAX_BATCH:,}], got {self.batch}"),
            (self.skip >= 1, f"--skip must be >= 1, got {self.skip}"),
            (self.max_images is None or self.max_images >= 1, f"--max must be >= 1, got {self.max_images}"),
            (0 <= self.seed < 2**64, f"--seed must be in [0, 2**64), got {self.seed}"),
            (self.workers is None or self.workers >= 0, f"--workers must be >= 0, got {self.workers}"),
            (not (self.overwrite and self.resume), "--overwrite and --resume exclude each other"),
            (all(math.isfinite(r) and r >= 0 for r in self.radii or ()), "--radii must be finite and >= 0"),
            (not (self.sequential and self.predict), "--sequential applies to CERTIFY, not --predict"),
            (self.noise in NOISE_CHOICES, f"--noise must be one of {', '.join(NOISE_CHOICES)}, got {self.noise!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)


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


def _images(dataset: Dataset, indices: list[int], workers: int, pin: bool):
    loader = DataLoader(_IndexedImages(dataset, indices), batch_size=None, num_workers=workers, pin_memory=pin)
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


def _kept_after_interrupt(config: CertifyConfig, mode: str, finished: int) -> str:
    """What an interrupted run leaves on disk, and how to continue."""
    if mode == "overwrite":
        return (f"{config.out} is unchanged; the {finished} rows of this run are in {config.out}.partial "
                "(not resumable: run again with --overwrite)")
    return (f"{finished} new rows are in {config.out} (run record marked interrupted); continue with the same "
            "command and --resume")


def _output_mode(config: CertifyConfig) -> str:
    out = Path(config.out)
    _check_out_directory(out)
    if config.resume:
        if out.exists():
            _check_resumable(config)
        return "append"  # a run stopped before its first row: nothing to check, start it
    if out.exists() and not config.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it or --resume to continue it")
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


def _write_sidecar(config: CertifyConfig, body: BatchBody, engine: Engine, procedure: _Procedure,
                   loader_workers: int, summary: dict) -> None:
    record = {
        "config": dataclasses.asdict(config),
        "procedure": procedure.name,
        "plan": {"phases": [p.name for p in procedure.plan.phases], "sizes": procedure.plan.sizes,
                 "looks": procedure.plan.looks},
        "engine": body.description,
        "threads": {"torch_intra_op": torch.get_num_threads(), "dataloader_workers": loader_workers,
                    "body_workers": getattr(body, "workers", None)},
        "classifier": engine.spec.to_json_dict(),
        "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "device_name": device_name(engine.device),
        **summary,
    }
    _sidecar(config).write_text(json.dumps(record, indent=2, default=str) + "\n")


@dataclass(frozen=True)
class _Procedure:
    """How a run samples (plan, early-stopping rule) and turns counts into result rows."""

    name: str
    level: float  # the Clopper-Pearson level of the certificate's bound (alpha, or alpha / K)
    plan: SamplingPlan
    decide: Decide | None
    decision: Callable[[np.ndarray], Certificate] | None  # CERTIFY: counts -> certificate

    def rules(self, config: CertifyConfig) -> RowRules:
        """What the rows of this run satisfy (checked on the rows a --resume keeps)."""
        if self.decision is None:
            return RowRules("predict", 0, (config.n,), config.alpha, config.sigma, None)
        sizes = tuple(size - config.n0 for size in self.plan.stage_ends) if self.plan.looks else (config.n,)
        return RowRules("certify", config.n0, sizes, self.level, config.sigma, self.name)

    def row(self, config: CertifyConfig, done: ImageCounts, seconds: float) -> CertifyRow | PredictRow:
        correct = lambda prediction: int(prediction == done.label)  # noqa: E731
        if self.decision is None:
            p = predict_from_counts(done.counts[0], config.alpha)
            return PredictRow(done.index, done.label, p.prediction, correct(p.prediction), seconds,
                              p.n, p.count1, p.count2, p.pvalue, config.sigma)
        c = self.decision(done.counts)
        return CertifyRow(done.index, done.label, c.prediction, c.radius, correct(c.prediction), seconds,
                          c.n0, c.n, c.n_a, c.p_a_lower, config.sigma, self.name)


def _procedure(config: CertifyConfig) -> _Procedure:
    if config.predict:
        return _Procedure("predict", config.alpha, SamplingPlan.predict(config.n), None, None)
    if not config.sequential:
        fixed = lambda counts: certify_from_counts(counts[0], counts[1], config.alpha, config.sigma)  # noqa: E731
        return _Procedure(FIXED_N, config.alpha, SamplingPlan.certify(config.n0, config.n), None, fixed)
    sequential = SequentialCertifier(SequentialConfig(
        config.n0, config.n, config.alpha, config.sigma, config.radii or PAPER_RADII, config.looks, config.futility))
    return _Procedure(
        sequential.procedure,
        sequential.level,
        SamplingPlan.sequential(config.n0, sequential.looks),
        sequential.decide,
        lambda counts: sequential.certify(counts[0], int(counts[1, np.argmax(counts[0])]), int(counts[1].sum())),
    )


def _engine_input(config: CertifyConfig) -> str:
    """"tokens" for a token engine on the fast path (its front end feeds it), else "image"."""
    path = Path(config.engine)
    if config.fast_body and path.suffix in KIND_BY_SUFFIX and path.is_file():
        return read_sidecar(path).input
    return "image"


@dataclass(frozen=True)
class RunResult:
    """What a completed run did; ``config`` is resolved (sigma and precision as used)."""

    config: CertifyConfig
    images: int
    samples: int
    elapsed_s: float
    samples_per_s: float


Row = CertifyRow | PredictRow


def certify_dataset(config: CertifyConfig, on_row: Callable[[Row], None] | None = None) -> RunResult:
    """Run one certification as configured: open the classifier and the data, check a resumed
    file, stream the images, write each row (and pass it to ``on_row``) as the image finishes,
    keep the run record ``<out>.json``.

    The results file is locked for the whole run: a second run on the same ``out`` is refused.
    Bad input raises :class:`UserError`; SIGINT/SIGTERM (with :func:`interrupt_on_signals`)
    raise :class:`Interrupted` after marking the record, its ``kept`` saying what is on disk.
    """
    config.validate()
    if not config.resume:
        _output_mode(config)  # refuse an existing --out before loading anything
    _check_out_directory(Path(config.out))
    with OutputLock(config.out, "results file"):
        return _certify_locked(config, on_row or (lambda row: None))


def _certify_locked(config: CertifyConfig, on_row: Callable[[Row], None]) -> RunResult:
    mean, std = parse_normalization(config.normalize)
    options = EngineOptions(config.device, config.precision, config.input_size, mean, std, _engine_input(config))
    engine = open_engine(config.engine, options)
    if config.sigma is None and engine.spec.sigma is None:
        raise UserError("--sigma is required: the checkpoint does not record the sigma it was trained for")
    sigma = config.sigma if config.sigma is not None else engine.spec.sigma
    config = dataclasses.replace(config, sigma=sigma, precision=engine.precision)
    config.validate()  # the sigma the checkpoint or sidecar recorded, like --sigma
    mode = _output_mode(config)
    if mode == "append" and not Path(config.out).exists():
        print(f"{PROG}: --resume: {config.out} does not exist yet; starting the run", file=sys.stderr)
    image_size = config.image_size if config.image_size is not None else engine.spec.input_size
    dataset = open_dataset(config.data, split=config.split, labels=config.labels, image_size=image_size)
    _check_compatible(engine, dataset, config.data)
    indices = subset_indices(len(dataset), config.skip, config.max_images)
    procedure = _procedure(config)
    plan = procedure.plan
    if mode == "append":
        kept = read_kept_rows(config.out)
        if kept is not None:
            check_kept_rows(kept, indices, dataset_labels(dataset, indices), procedure.rules(config))
            done = set(kept.idx.tolist())
            indices = [i for i in indices if i not in done]
    timer = StageTimer(engine.device) if config.profile else None
    body = batch_body(engine, config.sigma, config.seed, config.batch, config.body_options, timer)
    streamer = StreamingCertifier(engine, plan, config.sigma, config.seed, config.batch, body)
    workers = config.workers if config.workers is not None else _loader_workers(dataset, engine.device)
    images = _images(dataset, indices, workers, pin=engine.device.type == "cuda")
    print(f"{PROG}: {len(indices)} images, {'up to ' if plan.looks else ''}{plan.total:,} samples each, "
          f"{procedure.name}, sigma {config.sigma}, {body.description}, batch {config.batch} -> {config.out}",
          file=sys.stderr)
    record = (lambda summary: None) if mode == "overwrite" else \
        (lambda summary: _write_sidecar(config, body, engine, procedure, workers, summary))
    record({"status": "running"})  # an overwritten run's old record stays until the new results replace it
    start = time.perf_counter()
    finished = samples = 0
    bar = tqdm(total=len(indices), unit="img", desc="certifying" if not config.predict else "predicting",
               disable=not config.progress, mininterval=0.5, file=sys.stderr)
    profiler = _profiler(config, engine.device)
    try:
        with ResultsWriter(config.out, kind="predict" if config.predict else "certify", mode=mode) as writer, \
                bar, profiler:
            for done in streamer.run(images, procedure.decide):
                finished += 1
                samples += int(done.counts.sum())
                elapsed = time.perf_counter() - start
                row = procedure.row(config, done, elapsed / finished)  # time: the image's share of the run's
                writer.write(row)
                on_row(row)
                bar.update()
                bar.set_postfix_str(f"{samples / elapsed:,.0f} samples/s")
    except Interrupted as stop:
        record({"status": "interrupted", "images": finished})
        stop.kept = _kept_after_interrupt(config, mode, finished)
        raise
    except UserError as error:
        record({"status": "failed", "images": finished, "error": str(error)})
        raise
    elapsed = time.perf_counter() - start
    rate = samples / elapsed if elapsed > 0 else float("nan")
    if timer is not None:
        _report_profile(config, profiler, timer, elapsed)
    _write_sidecar(config, body, engine, procedure, workers,
                   {"status": "complete", "images": finished, "samples": samples,
                    "elapsed_s": round(elapsed, 3), "samples_per_s": round(rate, 1)})
    return RunResult(config, finished, samples, elapsed, rate)


