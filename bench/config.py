"""What ``dmae-bench`` runs, as typed configurations (the benchmark, ``serve``, ``scaling``) with the
models and variants its options name: no torch here, so the commands check their options first."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dmae_fast.base.errors import UserError
from dmae_fast.demo_files import DEMO, DEMO_CHECKPOINT
from dmae_fast.export.config import device_problem
from dmae_fast.model.config import ENCODER_PRESETS, ClassifierSpec, EncoderConfig
from dmae_fast.run.config import MAX_BATCH

PROG = "dmae-bench"
MODEL_SPECS = {  # random weights: speed does not depend on them
    "vit-b16": ClassifierSpec(ENCODER_PRESETS["base"], num_classes=1000, input_size=224),
    "vit-l16": ClassifierSpec(ENCODER_PRESETS["large"], num_classes=1000, input_size=224),
    "tiny-cpu": ClassifierSpec(EncoderConfig(32, 2, 2, patch_size=4, img_size=16), num_classes=10, input_size=16),
    # small ViTs for CPU comparisons (dmae-bench cpu): width 64, 4 blocks, 4 heads, 64 and 196 patches
    "small-32": ClassifierSpec(EncoderConfig(64, 4, 4, patch_size=4, img_size=32), num_classes=10, input_size=32),
    "small-224": ClassifierSpec(EncoderConfig(64, 4, 4, patch_size=16, img_size=224), num_classes=10,
                                input_size=224),
}
MODELS = ("vit-b16", "vit-l16", "demo", *[m for m in MODEL_SPECS if m not in ("vit-b16", "vit-l16")])
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
VARIANT_KEYS = ("eager", "autocast", "fused", "compiled", "compiled+graphs", "fused+graphs", "fused+compiled+graphs")
MAX_SAMPLES = 2**32 - 1  # --n0, --n: as dmae-certify's --n
PAPER_IMAGES = 1000  # the paper's ImageNet protocol; the CERTIFY timing is extrapolated to it


def variant_key(name: str) -> str:
    """'ours: fused + compiled + CUDA graphs' -> 'fused+compiled+graphs' (the --variants spelling)."""
    return name.removeprefix("ours: ").replace(" + ", "+").replace("CUDA graphs", "graphs")


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run (the command line, resolved)."""

    out: str
    throughput: bool = True
    certify: bool = True
    models: tuple[str, ...] = ("vit-b16", "vit-l16", "demo")
    batches: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)  # the sweep
    main_batch: int = 512  # every variant is measured here
    seconds: float = 3.0  # per throughput row, after warm-up
    budget_s: float = 480.0  # rows that would start later are skipped, saying so
    compile_mode: str = "default"
    engines: tuple[str, ...] = ()  # user-supplied engine files, timed as they are
    variants: tuple[str, ...] = ()  # our variants to time, by key (see variant_key); () = all
    precisions: tuple[str, ...] = ()  # our variants' precisions on CUDA (fp16, bf16, fp8); () = fp16 and bf16
    export_models: tuple[str, ...] = ("vit-b16", "demo")  # exported to engines, then timed
    engine_dir: str | None = None  # where exports go (default: the output directory)
    certify_model: str = "vit-b16"
    images: int = 20
    n0: int = 100
    n: int = 10_000
    reference_budget_s: float = 30.0  # per reference loop in the certify timing
    device: str = "auto"
    smoke: bool = False

    @classmethod
    def smoke_run(cls, out: str, device: str = "cpu") -> BenchConfig:
        """A few seconds on the CPU: every stage runs, nothing about speed is claimed."""
        return cls(out, models=("tiny-cpu", "demo"), batches=(16, 32), main_batch=32, seconds=0.3, budget_s=120,
                   export_models=("tiny-cpu",), certify_model="tiny-cpu", images=2, n0=10, n=60,
                   reference_budget_s=2.0, device=device, smoke=True)

    def validate(self) -> None:
        unknown = [m for m in (*self.models, *self.export_models, self.certify_model) if m not in MODELS]
        durations = (self.seconds, self.budget_s, self.reference_budget_s)
        bad_device = device_problem(self.device)
        checks = [
            (not unknown, f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}"),
            (all(1 <= b <= MAX_BATCH for b in (*self.batches, self.main_batch)),
             f"batch sizes (--batches, --main-batch) must be in [1, {MAX_BATCH:,}]"),
            (all(math.isfinite(v) and v > 0 for v in durations),
             "--seconds, --budget and --reference-budget must be finite numbers > 0"),
            (not self.throughput or self.seconds < self.budget_s,
             f"--seconds {self.seconds:g} per row leaves no row within --budget {self.budget_s:g}"),
            (not self.certify or self.reference_budget_s < self.budget_s,
             (f"--reference-budget {self.reference_budget_s:g} leaves no reference loop within --budget "
              f"{self.budget_s:g}")),
            (not (set(self.variants) - set(VARIANT_KEYS)),
             f"unknown --variants {', '.join(sorted(set(self.variants) - set(VARIANT_KEYS)))}; choose from "
             f"{', '.join(VARIANT_KEYS)}"),
            (set(self.precisions) <= {"fp16", "bf16", "fp8"},
             "--precisions takes fp16, bf16 and/or fp8 (the CUDA variants)"),
            (self.compile_mode in COMPILE_MODES,
             f"--compile-mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}"),
            (1 <= self.images <= PAPER_IMAGES,
             f"--images must be in [1, {PAPER_IMAGES}] (the timing is extrapolated to the paper's {PAPER_IMAGES:,})"),
            (1 <= self.n0 <= MAX_SAMPLES and 1 <= self.n <= MAX_SAMPLES, "--n0 and --n must be in [1, 2**32)"),
            (self.out != "" and self.engine_dir != "", "--out and --engine-dir must name directories"),
            (bad_device is None, bad_device),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)


@dataclass(frozen=True)
class ServeBenchConfig:
    """One ``dmae-bench serve`` run (:mod:`dmae_fast.bench.serve`)."""

    out: str = "bench/results/serve"
    ckpt: str = DEMO
    device: str = "auto"
    batch: int = 1000
    n: int = 200  # PREDICT samples per request (one image each)
    max_waits_ms: tuple[float, ...] = (0.0, 5.0, 20.0, 50.0)
    loads: tuple[float, ...] = (0.25, 0.5, 0.9)
    clients: int = 32  # closed-loop clients at saturation
    rounds: int = 4  # saturation: offline and server measurements interleaved, medians kept
    saturation_s: float = 5.0  # per saturation round and server
    seconds: float = 20.0  # per latency measurement
    warmup_s: float = 3.0
    offline_images: int = 150
    fast: bool = False
    quick: bool = False  # a few seconds per step, for checking the setup

    def validate(self) -> None:
        checks = [
            (1 <= self.batch <= 2**20, f"--batch must be in [1, 2**20], got {self.batch}"),
            (1 <= self.n <= 100_000, f"--n must be in [1, 100000], got {self.n}"),
            (bool(self.max_waits_ms) and all(0 <= t <= 60_000 for t in self.max_waits_ms),
             "--max-wait-ms values must be in [0, 60000]"),
            (bool(self.loads) and all(0 < f < 1 for f in self.loads), "--loads must be fractions in (0, 1)"),
            (self.clients >= 1, f"--clients must be >= 1, got {self.clients}"),
            (math.isfinite(self.seconds) and self.seconds > 0, f"--seconds must be > 0, got {self.seconds}"),
            (math.isfinite(self.saturation_s) and self.saturation_s > 0,
             f"--saturation-seconds must be > 0, got {self.saturation_s}"),
            (self.rounds >= 1, f"--rounds must be >= 1, got {self.rounds}"),
            (self.offline_images >= 1, f"--offline-images must be >= 1, got {self.offline_images}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    @property
    def checkpoint(self) -> str:
        return str(DEMO_CHECKPOINT) if self.ckpt == DEMO else self.ckpt


DEFAULT_CERTIFY = ("--data", "demo", "--max", "40", "--n", "10000", "--seed", "0")  # rows compared across counts


@dataclass(frozen=True)
class ScalingConfig:
    """One ``dmae-bench scaling`` run (:mod:`dmae_fast.bench.scaling`)."""

    out: str = "bench/results"
    procs: tuple[int, ...] = (1, 2)
    rounds: int = 3
    threads: int | None = 1  # intra-op threads per process (None: dmae-certify's default)
    certify: tuple[str, ...] = DEFAULT_CERTIFY  # dmae-certify arguments (no --out)

    def validate(self) -> None:
        if not self.procs or min(self.procs) < 1:
            raise UserError(f"--procs must be >= 1, got {list(self.procs)}")
        if self.rounds < 1:
            raise UserError(f"--rounds must be >= 1, got {self.rounds}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be >= 1, got {self.threads}")
        if "--out" in self.certify or any(a.startswith("--out=") for a in self.certify):
            raise UserError("give no --out to dmae-certify: the benchmark names its own results files")


@dataclass(frozen=True)
class StallConfig:
    """One ``dmae-bench stall`` run (:mod:`dmae_fast.bench.stall`): fixed-n against ``--sequential`` on an
    emulated asynchronous device, over the simulated ImageNet-shaped population."""

    out: str = "bench/results"
    images: tuple[int, ...] = (16, 1000)
    caps: tuple[int, ...] = (10_000, 100_000)  # n: fixed-n's estimation samples, --sequential's cap
    n0: int = 100
    sigma: float = 0.25
    alpha: float = 0.001
    batch: int = 1024
    batch_ms: float = 20.0  # the emulated device's time per batch, whatever its rows
    fixed_seconds: float = 15.0  # a fixed-n run stops after this long (its rate is steady)
    rounds: int = 1  # interleaved; medians are kept
    seed: int = 0

    def validate(self) -> None:
        checks = [
            (bool(self.images) and min(self.images) >= 1, f"--images must be >= 1, got {list(self.images)}"),
            (bool(self.caps) and min(self.caps) >= 1 and max(self.caps) <= MAX_SAMPLES,
             f"--caps must be in [1, 2**32), got {list(self.caps)}"),
            (1 <= self.n0 <= MAX_SAMPLES, f"--n0 must be in [1, 2**32), got {self.n0}"),
            (math.isfinite(self.sigma) and 0 < self.sigma <= 1, f"--sigma must be in (0, 1], got {self.sigma}"),
            (0 < self.alpha < 1, f"--alpha must be in (0, 1), got {self.alpha}"),
            (1 <= self.batch <= MAX_BATCH, f"--batch must be in [1, {MAX_BATCH:,}], got {self.batch}"),
            (math.isfinite(self.batch_ms) and self.batch_ms > 0, f"--batch-ms must be > 0, got {self.batch_ms}"),
            (math.isfinite(self.fixed_seconds) and self.fixed_seconds > 0,
             f"--fixed-seconds must be > 0, got {self.fixed_seconds}"),
            (self.rounds >= 1, f"--rounds must be >= 1, got {self.rounds}"),
            (0 <= self.seed < 2**64, f"--seed must be in [0, 2**64), got {self.seed}"),
            (self.out != "", "--out must name a directory"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
