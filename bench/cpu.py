"""``dmae-bench cpu``: the reference loops and ours on a CPU, in one run, at equal thread counts.

For each thread count T (torch's intra-op threads for the reference loops and our plain
body; T workers of one thread for the fast body) and each model, every method certifies the
same images (CERTIFY: n0 + n samples each). The methods run interleaved, ``rounds`` times, and
the median is kept: other jobs on a shared machine slow all methods alike instead of one.

* Cohen et al.'s loop and DMAE's loop (:mod:`.reference_loops`; DMAE's fp16 autocast is a
  CUDA autocast, a no-op for CPU tensors, so it runs in fp32 here);
* ours: plain body with the torch-op reference noise (the previous default), plain body with
  compiled noise (the default), ``--fast`` (its default runtime: OpenVINO where installed),
  ``--fast --cpu-runtime onnxruntime``, a torch.compile'd body, and ``--fast --precision bf16``
  where the CPU has bf16 instructions (opt-in);
* ``--sound`` (docs/sound.md) on the plain body and on ``--fast``: the exact rounded Gaussian on the
  images' grid (the demo digits' 1/16, 1/255 for the other models' 8-bit images), to compare with the
  same body's default noise.

The fp32 methods of ours must give counts identical to the plain body (checked and
recorded). MFU is samples/s x the model's forward FLOPs over the fp32 matmul peak measured at
the same thread count in the same run: how far from the CPU's limit each method is. Every
method runs with the process keeping freed memory (:mod:`dmae_fast.base.memory`), set before the
first one, so that no method page-faults its per-batch tensors in anew each batch. The noise
table compares Gaussians/s of torch.randn, the compiled noise and the reference at the same
thread count. With ``commands`` (``--commands 10 100``), whole commands too: Cohen's loop as
a program against ``dmae-certify`` plain and fast, start-up included (:mod:`.commands`).
Writes ``<stem>.json`` and ``<stem>.md``.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dmae_fast import __version__
from dmae_fast.base.errors import UserError
from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.fast_body import FastBody, FastPath
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.bench.commands import N0, PROGRAMS, N, time_commands
from dmae_fast.bench.flops import vit_forward_flops
from dmae_fast.bench.peak import matmul_peak
from dmae_fast.bench.reference_loops import COHEN, DMAE, ReferenceLoop
from dmae_fast.bench.report import result_stem
from dmae_fast.bench.throughput import build_model
from dmae_fast.data.sources import DEMO_TEST_SIZE
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.noise.contract import gaussian_noise, gaussian_rows, key_words
from dmae_fast.noise.sound_options import BYTE_GRID, Sound, default_grid
from dmae_fast.run.host import device_name

SIGMA, SEED = 0.25, 0
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Workload:
    """A model and how many samples each method spends on it."""

    model: str
    images: int
    n0: int
    n: int
    batch: int  # our bodies' --batch, dmae-certify's default (the reference loops keep their own: 400 and 1000)


WORKLOADS = {
    "demo": Workload("demo", 3, 100, 10_000, 1000),
    "small-32": Workload("small-32", 2, 100, 2_000, 1000),
    "small-224": Workload("small-224", 1, 100, 1_000, 1000),  # plain body: 600 MB of 224x224 noise a batch
}
NOISE_SHAPES = ((3, 8, 8), (3, 32, 32), (3, 224, 224))
SOUND_NOISE = "--sound ((X + Z) / 255)"  # the noise table's --sound candidate (NoiseSource's C kernel on a CPU)


@dataclass(frozen=True)
class CpuBenchConfig:
    out: str = "bench/results"
    threads: tuple[int, ...] = (1, 2)
    models: tuple[str, ...] = tuple(WORKLOADS)
    rounds: int = 3
    quick: bool = False  # a few seconds: tiny sample counts (tests)
    commands: tuple[int, ...] = ()  # whole commands, start-up included, for these demo image counts (.commands)

    def validate(self) -> None:
        unknown = [m for m in self.models if m not in WORKLOADS]
        if unknown:
            raise UserError(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
        if not self.threads or not all(1 <= t <= 1024 for t in self.threads):
            raise UserError("--threads must be whole numbers in [1, 1024]")
        if not 1 <= self.rounds <= 100:
            raise UserError(f"--rounds must be in [1, 100], got {self.rounds}")
        if not all(1 <= images <= DEMO_TEST_SIZE for images in self.commands):
            raise UserError(f"--commands takes demo image counts in [1, {DEMO_TEST_SIZE}]")


@dataclass
class MethodRow:
    threads: int
    model: str
    method: str
    samples: int
    seconds: list[float]
    samples_per_s: float = 0.0
    vs_cohen: float = 0.0
    vs_dmae: float = 0.0
    mfu: float = 0.0  # against the fp32 matmul peak at this thread count
    counts_equal_plain: bool | None = None  # fp32 methods of ours: identical counts to the plain body
    description: str = ""


@dataclass
class NoiseRow:
    threads: int
    shape: tuple[int, ...]
    gaussians_per_s: dict[str, float] = field(default_factory=dict)


def bf16_supported() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX): else bf16 is emulated and slow."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def reference_run(loop: ReferenceLoop, model, images, load: Workload) -> Callable[[], np.ndarray]:
    def run() -> np.ndarray:
        return np.stack([np.stack([loop.counts(model, image, load.n0, SIGMA), loop.counts(model, image, load.n, SIGMA)])
                         for image in images])
    return run


def ours_run(smoothing: Smoothing, body, images, load: Workload) -> Callable[[], np.ndarray]:
    items = [(i, image, 0) for i, image in enumerate(images)]

    def run() -> np.ndarray:
        plan = SamplingPlan.certify(load.n0, load.n)
        done = StreamingCertifier(smoothing, plan, body).run(items)
        return np.stack([d.counts for d in done])
    return run


def _methods(model, images, load: Workload, threads: int) -> dict[str, tuple[Callable[[], np.ndarray], str, bool]]:
    """name -> (run, description, fp32 method of ours whose counts must equal the plain body's)."""
    smoothing = Smoothing(TorchEngine(model, CPU, "fp32"), SIGMA, SEED, load.batch)
    plain_reference = batch_body(smoothing, BodyOptions(noise="reference"))
    plain = batch_body(smoothing, BodyOptions())
    fast = batch_body(smoothing, BodyOptions(fast=True, workers=threads))
    fast_ort = batch_body(smoothing, BodyOptions(fast=True, workers=threads, cpu_runtime="onnxruntime"))
    compiled = FastBody(smoothing, FastPath(compile=True, compile_mode="default"))
    sounded = replace(smoothing, sound=Sound(default_grid(load.model == "demo")))
    plain_sound = batch_body(sounded, BodyOptions())
    fast_sound = batch_body(sounded, BodyOptions(fast=True, workers=threads))
    methods = {
        "reference: Cohen et al. (fp32, batch 400)": (reference_run(COHEN, model, images, load), COHEN.name, False),
        "reference: DMAE (fp32 on CPU, batch 1000)": (
            reference_run(ReferenceLoop(DMAE.name, "fp32", DMAE.batch_size, DMAE.host_counts), model, images, load),
            DMAE.name, False),
        "ours: plain, reference noise": (ours_run(smoothing, plain_reference, images, load),
                                         plain_reference.description, True),
        "ours: plain (compiled noise)": (ours_run(smoothing, plain, images, load), plain.description, True),
        "ours: --fast (fp32)": (ours_run(smoothing, fast, images, load), fast.description, True),
        "ours: --fast --cpu-runtime onnxruntime": (
            ours_run(smoothing, fast_ort, images, load), fast_ort.description, True),
        "ours: compiled body": (ours_run(smoothing, compiled, images, load), compiled.description, True),
        "ours: plain --sound": (ours_run(sounded, plain_sound, images, load), plain_sound.description, False),
        "ours: --fast --sound": (ours_run(sounded, fast_sound, images, load), fast_sound.description, False),
    }
    if bf16_supported():
        bf16_smoothing = replace(smoothing, engine=TorchEngine(model, CPU, "bf16"))
        bf16 = batch_body(bf16_smoothing, BodyOptions(fast=True, workers=threads))
        methods["ours: --fast --precision bf16"] = (ours_run(bf16_smoothing, bf16, images, load), bf16.description,
                                                    False)
    return methods


def timed(run: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    counts = run()
    return time.perf_counter() - start, counts


def measure_model(load: Workload, threads: int, rounds: int, progress: tqdm, peak_flops: float) -> list[MethodRow]:
    """Every method on one model at one thread count, interleaved ``rounds`` times; medians."""
    torch.set_num_threads(threads)
    model = build_model(load.model, CPU)
    generator = torch.Generator().manual_seed(1)
    # 8-bit images, on --sound's grid
    images = [torch.randint(0, 256, model.spec.input_shape, generator=generator) / 255 for _ in range(load.images)]
    if load.model == "demo":  # real digits: the counts comparison means something
        from dmae_fast.data import demo_digits

        digits = demo_digits("test")
        images = [digits[i][0] for i in range(load.images)]
    methods = _methods(model, images, load, threads)
    warm = Workload(load.model, 1, min(load.n0, 10), min(load.n, 200), load.batch)
    for name, (run, _, _) in _methods(model, images[:1], warm, threads).items():
        run()  # compile, export, first-touch
    samples = load.images * (load.n0 + load.n)
    rows = {name: MethodRow(threads, load.model, name, samples, [], description=description)
            for name, (_, description, _) in methods.items()}
    counts: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for name, (run, _, _) in methods.items():
            seconds, counts[name] = timed(run)
            rows[name].seconds.append(seconds)
            progress.update()
    plain = counts["ours: plain (compiled noise)"]
    for name, (_, _, must_equal) in methods.items():
        row = rows[name]
        row.samples_per_s = samples / statistics.median(row.seconds)
        if name.startswith("ours"):
            row.counts_equal_plain = bool(np.array_equal(counts[name], plain)) if must_equal else None
    cohen, dmae = (rows[n].samples_per_s for n in list(methods)[:2])
    for row in rows.values():
        row.vs_cohen, row.vs_dmae = row.samples_per_s / cohen, row.samples_per_s / dmae
        row.mfu = row.samples_per_s * vit_forward_flops(model.spec) / peak_flops
    return list(rows.values())


def measure_noise(shape: tuple[int, ...], threads: int, seconds: float) -> NoiseRow:
    """Gaussians/s at one image shape, each for ``seconds``: torch.randn; the contract's
    generator compiled (eta alone, like randn); the compiled noisy images of the certifier
    (gather and x + sigma * eta included); the torch-op reference."""
    torch.set_num_threads(threads)
    rows = max(1, 2**22 // math.prod(shape))
    clean = torch.randint(0, 256, (4, *shape)) / 255
    slot, index = torch.arange(rows) % 4, torch.arange(rows) % 7
    phase, sample = torch.ones(rows, dtype=torch.int64), torch.arange(rows)
    compiled, sound = NoiseSource(CPU), NoiseSource(CPU, grid=BYTE_GRID)
    for column in (index, phase, sample):
        torch._dynamo.mark_dynamic(column, 0)
    key = torch.tensor(key_words(SEED))
    generator = torch.compile(lambda: gaussian_rows((key[0], key[1]), index, phase, sample, math.prod(shape)))
    candidates = {
        "torch.randn": lambda: torch.randn((rows, *shape)),
        "compiled eta": generator,
        "compiled (x + sigma * eta)": lambda: compiled(clean, slot, SIGMA, SEED, index, phase, sample),
        SOUND_NOISE: lambda: sound(clean, slot, SIGMA, SEED, index, phase, sample),
        "torch-op reference": lambda: gaussian_noise(SEED, index, phase, sample, shape),
    }
    out = NoiseRow(threads, shape)
    for name, make in candidates.items():
        make()
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            make()
            calls += 1
        out.gaussians_per_s[name] = calls * rows * math.prod(shape) / (time.perf_counter() - start)
    return out


def run_cpu_bench(config: CpuBenchConfig) -> tuple[dict, list[Path]]:
    """Measure everything; returns the record and the files written."""
    config.validate()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    loads = [WORKLOADS[m] for m in config.models]
    if config.quick:
        loads = [Workload(load.model, 1, 10, 200, load.batch) for load in loads]
    allocator = keep_freed_memory()  # before any method: the reference loops run with it too
    saved_threads = torch.get_num_threads()
    rows: list[MethodRow] = []
    noise: list[NoiseRow] = []
    peaks: dict[int, float] = {}
    steps = len(config.threads) * len(loads) * config.rounds * (10 if bf16_supported() else 9)  # _methods
    steps += len(config.commands) * len(PROGRAMS) * (config.rounds + 1)
    try:
        with tqdm(total=steps, desc="dmae-bench cpu", unit="run") as progress:
            for threads in config.threads:
                torch._dynamo.reset()  # Inductor bakes the thread count into a kernel: compile anew
                torch.set_num_threads(threads)
                peaks[threads] = matmul_peak(CPU, torch.float32, seconds=0.2 if config.quick else 2.0)
                for shape in NOISE_SHAPES:
                    noise.append(measure_noise(shape, threads, 0.2 if config.quick else 2.0))
                for load in loads:
                    rows += measure_model(load, threads, config.rounds, progress, peaks[threads])
            commands = time_commands(config.commands, config.rounds, progress)
    finally:
        torch.set_num_threads(saved_threads)
    record = {
        "device": device_name(CPU).split(",")[0],
        "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version(),
                     "onnxruntime": _version("onnxruntime"), "openvino": _version("openvino")},
        "config": asdict(config),
        "host_allocator": allocator,
        "workloads": {load.model: asdict(load) for load in loads},
        "matmul_peak_flops": {str(threads): peak for threads, peak in peaks.items()},
        "methods": [asdict(row) for row in rows],
        "noise": [asdict(row) for row in noise],
        "commands": [asdict(row) for row in commands],
    }
    stem = out / result_stem(out, CPU, "-cpu")
    paths = [Path(f"{stem}.json"), Path(f"{stem}.md")]
    paths[0].write_text(json.dumps(record, indent=2) + "\n")
    paths[1].write_text(markdown(record))
    return record, paths


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def markdown(record: dict) -> str:
    """The two tables of a record."""
    loads = ", ".join(f"{m}: {w['images']} x ({w['n0']} + {w['n']})" for m, w in record["workloads"].items())
    peaks = ", ".join(f"{peak / 1e9:,.0f} GFLOP/s on {threads} thread(s)"
                      for threads, peak in record["matmul_peak_flops"].items())
    lines = [f"# dmae-bench cpu: {record['device']}", "",
             f"torch {record['versions']['torch']}, ONNX Runtime {record['versions']['onnxruntime']}, "
             f"OpenVINO {record['versions'].get('openvino')}; "
             f"medians of {record['config']['rounds']} interleaved rounds; CERTIFY images x (n0 + n) samples: "
             f"{loads}.",
             "", f"Host allocator (every method): {record.get('host_allocator', 'not recorded')}.",
             "", f"fp32 matmul peak (1024 x 1024, torch): {peaks}; MFU = samples/s x forward FLOPs / that peak.",
             "", "| threads | model | method | samples/s | vs Cohen | vs DMAE | MFU | counts = plain |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in record["methods"]:
        same = {True: "yes", False: "**no**", None: ""}[row["counts_equal_plain"]]
        lines.append(f"| {row['threads']} | {row['model']} | {row['method']} | {row['samples_per_s']:,.0f} | "
                     f"{row['vs_cohen']:.2f}x | {row['vs_dmae']:.2f}x | {row['mfu']:.0%} | {same} |")
    lines += ["", "Noise: Gaussians per second (M/s) at the same thread count", "",
              "| threads | image | torch.randn | compiled eta | compiled (x + sigma * eta) | --sound "
              "| torch-op reference | compiled eta / randn | --sound / compiled (x + sigma * eta) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in record["noise"]:
        rates = row["gaussians_per_s"]
        lines.append(f"| {row['threads']} | {'x'.join(map(str, row['shape']))} | {rates['torch.randn'] / 1e6:,.0f} | "
                     f"{rates['compiled eta'] / 1e6:,.0f} | {rates['compiled (x + sigma * eta)'] / 1e6:,.0f} | "
                     f"{rates[SOUND_NOISE] / 1e6:,.0f} | {rates['torch-op reference'] / 1e6:,.1f} | "
                     f"{rates['compiled eta'] / rates['torch.randn']:.2f}x | "
                     f"{rates[SOUND_NOISE] / rates['compiled (x + sigma * eta)']:.2f}x |")
    if record.get("commands"):
        lines += ["", f"Whole commands on the first N demo test digits (CERTIFY n0 {N0}, n {N:,}; each a new process, "
                  f"start-up included; medians of {record['config']['rounds']} interleaved rounds after a cold, "
                  "untimed-for-the-median first run; bench/commands.py)", "",
                  "| images | program | median s | vs Cohen | cold s |", "| --- | --- | --- | --- | --- |"]
        for row in record["commands"]:
            lines.append(f"| {row['images']} | {row['program']} | {row['median_s']:.1f} | {row['vs_cohen']:.2f}x | "
                         f"{row['cold_seconds']:.1f} |")
    return "\n".join(lines) + "\n"
