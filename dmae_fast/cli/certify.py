"""``dmae-certify``: certify (or predict) a dataset with a smoothed classifier.

    dmae-certify --data demo                      # the embedded demo, default settings
    dmae-certify --ckpt model.safetensors --data /imagenet/val --sigma 0.5 --skip 50
    dmae-certify analyze results.tsv --plot curve.png

Rows are written as images finish; ``<out>.json`` beside the results records the run.
"""

from __future__ import annotations

import argparse
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
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from dmae_fast import __version__
from dmae_fast.analysis import (
    DEFAULT_RADII,
    average_certified_radius,
    format_table,
    rounding_warning,
)
from dmae_fast.certification.core import (
    FIXED_N,
    Certificate,
    certify_from_counts,
    predict_from_counts,
)
from dmae_fast.certification.bodies import NOISE_CHOICES, BodyOptions, batch_body
from dmae_fast.certification.fast_stream import StageTimer
from dmae_fast.certification.sequential import (
    FUTILITY_MODES,
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
from dmae_fast.cli.common import Parser, parse_normalization, run_reporting_errors
from dmae_fast.data import DEMO, TensorImageDataset, open_dataset, subset_indices
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines import Engine, EngineOptions, open_engine
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX, read_sidecar
from dmae_fast.errors import Interrupted, UserError
from dmae_fast.locking import OutputLock
from dmae_fast.model.config import sigma_problem
from dmae_fast.results import (
    CertifyRow,
    PredictRow,
    ResultsWriter,
    read_kept_rows,
    read_results,
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


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Certify (CERTIFY) or predict (PREDICT) with a Gaussian-smoothed classifier, "
        "Cohen et al.'s procedures, samples from many images packed into full batches. "
        "Subcommand: 'dmae-certify analyze FILE...' summarizes results files.",
    )
    model = parser.add_argument_group("classifier")
    source = model.add_mutually_exclusive_group()
    source.add_argument("--ckpt", help="checkpoint: ours (.safetensors), official DMAE/MAE, timm; "
                        "'demo' for the embedded demo model (default with --data demo)")
    source.add_argument("--engine", help="engine file (.onnx, .engine/.plan, .pt2, with its sidecar) or checkpoint")
    model.add_argument("--input-size", type=int, help="side of the images the classifier receives, where "
                       "noise is added (default: from the checkpoint; e.g. 32 for DMAE CIFAR-10 models)")
    model.add_argument("--normalize", help="input normalization for checkpoints without metadata: "
                       "imagenet (default), cifar10, or 'm1,m2,m3:s1,s2,s3'")
    model.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"],
                       help="classifier precision (auto: fp32 on CPU, fp16 on CUDA)")
    data = parser.add_argument_group("data")
    data.add_argument("--data", required=True, help="'demo', an ImageFolder directory, a CIFAR-10 "
                      "python-batches directory, an image directory (with --labels) or a list file")
    data.add_argument("--labels", help="labels file ('filename label' lines) for an image directory")
    data.add_argument("--split", default="test", choices=["test", "train"], help="split of demo/CIFAR-10 data")
    data.add_argument("--image-size", type=int, help="resize + center-crop size for image files "
                      "(default: the classifier's input size)")
    data.add_argument("--skip", type=int, default=1, help="certify every SKIP-th image (paper: 50 on ImageNet)")
    data.add_argument("--max", dest="max_images", type=int, help="certify at most MAX images")
    data.add_argument("--workers", type=int, help="DataLoader workers (default: 0 for in-memory data, else 4)")
    smooth = parser.add_argument_group("smoothing")
    smooth.add_argument("--sigma", type=float, help="noise level in [0,1] pixel units "
                        "(default: the sigma the checkpoint was trained with, if recorded)")
    smooth.add_argument("--n0", type=int, default=100, help="selection samples (default 100)")
    smooth.add_argument("--n", type=int, default=10_000, help="estimation samples (default 10,000)")
    smooth.add_argument("--alpha", type=float, default=0.001, help="failure probability (default 0.001)")
    smooth.add_argument("--predict", action="store_true", help="run PREDICT (n samples, binomial test) instead")
    smooth.add_argument("--seed", type=int, default=0, help="64-bit noise seed (results are a function of it)")
    run = parser.add_argument_group("run")
    run.add_argument("--batch", type=int, default=1000, help="noisy samples per forward pass (default 1000)")
    run.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    run.add_argument("--out", help="results file (default: a new timestamped .tsv in the current directory)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing --out (atomically, at the end)")
    run.add_argument("--resume", action="store_true", help="continue an existing --out: certify only missing images")
    run.add_argument("--radii", type=float, nargs="+", help="radii of the summary table (default 0, 0.25, ..., 3); "
                     "with --sequential also the radii of interest (default the paper's 0.5 1 1.5 2 3)")
    seq = parser.add_argument_group("sequential certification (opt-in; same alpha guarantee, fewer samples)")
    seq.add_argument("--sequential", action="store_true", help="stop sampling an image as soon as the largest "
                     "reachable radius of interest is certified, or the next one is out of reach; --n is the cap")
    seq.add_argument("--looks", type=int, nargs="+", help="cumulative estimation samples at which to decide "
                     "(last = --n; default: 6 looks doubling up to --n); Clopper-Pearson at alpha/K over K looks")
    seq.add_argument("--futility", default="deterministic", choices=FUTILITY_MODES,
                     help="early abstain/lower-radius stop: deterministic (only when even all remaining samples "
                     "could not reach the next radius; costs no certificate), upper (also by a 99%% upper bound), none")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    fast = parser.add_argument_group("fast path (PyTorch checkpoints, or token engines from dmae-export --input "
                                     "tokens; same counts up to the classifier's rounding)")
    fast.add_argument("--fused", action="store_true", help="Triton kernel: noise + patch embedding in one pass "
                      "(falls back, with a notice, for classifiers that resize inside, e.g. CIFAR-10)")
    fast.add_argument("--compile", action="store_true", help="torch.compile the transformer body")
    fast.add_argument("--cuda-graphs", action="store_true", help="capture each batch's work once, replay it (CUDA)")
    fast.add_argument("--fast", action="store_true", help="the fastest body for the device: on CUDA --fused "
                      "--compile --cuda-graphs; on a CPU one worker per core on cache-sized chunks, ONNX Runtime "
                      "(fp32) or PyTorch (--precision bf16) (docs/performance.md)")
    fast.add_argument("--noise", default="compiled", choices=NOISE_CHOICES, help="compiled (default): the noise "
                      "contract as one compiled kernel, falling back with a notice; reference: the torch-op "
                      "reference (slow; same noise to float32 rounding)")
    fast.add_argument("--profile", metavar="DIR", help="write a torch profiler trace (DIR/trace.json) and print "
                      "a per-stage breakdown (front end, body, counting, host); use with a small --max")
    return parser


def _config_from_args(args: argparse.Namespace) -> CertifyConfig:
    engine = args.engine or args.ckpt or (str(DEMO_CHECKPOINT) if args.data == DEMO else None)
    if engine is None:
        raise UserError("--ckpt (or --engine) is required unless --data demo")
    if engine == DEMO:
        engine = str(DEMO_CHECKPOINT)
    out = args.out or f"certify-{Path(args.data).name or 'data'}-{datetime.now():%Y%m%d-%H%M%S}.tsv"
    fields = {f.name for f in dataclasses.fields(CertifyConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    values.update(engine=engine, out=out, progress=not args.quiet, sigma=args.sigma,
                  radii=tuple(args.radii) if args.radii else None, looks=tuple(args.looks) if args.looks else None)
    return CertifyConfig(**values)


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


def _device_name(device: torch.device) -> str:
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
        "device_name": _device_name(engine.device),
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


def certify(config: CertifyConfig) -> int:
    """Run one certification as configured; returns the exit status.

    The results file is locked for the whole run: a second run on the same --out is refused.
    """
    config.validate()
    if not config.resume:
        _output_mode(config)  # refuse an existing --out before loading anything
    _check_out_directory(Path(config.out))
    with OutputLock(config.out, "results file"):
        return _certify_locked(config)


def _certify_locked(config: CertifyConfig) -> int:
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
                writer.write(procedure.row(config, done, elapsed / finished))  # per-image share of the run's time
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
    _print_summary(config, finished, elapsed, rate)
    return 0


def _print_summary(config: CertifyConfig, finished: int, elapsed: float, rate: float) -> None:
    print(f"{PROG}: {finished} images in {elapsed:.1f} s ({rate:,.0f} noisy samples/s); results in {config.out}",
          file=sys.stderr)
    table = read_results(config.out)
    if len(table) == 0:
        return
    warning = rounding_warning(table)  # rows of an older run that this one resumed
    if warning:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    radii = config.radii or ((0.0,) + PAPER_RADII if config.sequential else DEFAULT_RADII)
    if config.sequential:
        radii = tuple(sorted({0.0, *radii}))
    print(format_table([table], radii))
    if table.kind == "certify":
        print(f"average certified radius (ACR): {average_certified_radius(table):.3f}; "
              f"clean accuracy of the smoothed classifier: {np.mean(table.correct):.1%}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["analyze"]:
        from dmae_fast.cli.analyze import main as analyze_main

        return analyze_main(argv[1:])
    return run_reporting_errors(PROG, lambda: certify(_config_from_args(build_parser().parse_args(argv))))


if __name__ == "__main__":
    sys.exit(main())
