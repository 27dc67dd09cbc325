"""The ``dmae-bench`` run itself (:func:`run_bench`): the throughput table, the exported engines it
times and the CERTIFY timing, within the time budget; ``dmae_fast.bench.command`` is its parser."""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from dmae_fast import __version__
from dmae_fast.base.errors import UserError, raise_if_interrupted
from dmae_fast.batching.fast_body import FastPath
from dmae_fast.bench import engines as bench_engines
from dmae_fast.bench import report
from dmae_fast.bench.config import PROG, BenchConfig, variant_key
from dmae_fast.bench.e2e import CertifyTiming, time_ours, time_reference
from dmae_fast.bench.peak import matmul_peak
from dmae_fast.bench.reference_loops import COHEN, DMAE
from dmae_fast.bench.throughput import Row, Variant, add_ratios, build_model, measure
from dmae_fast.engines.opening import EngineOptions, open_engine, resolve_device
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX, BatchRange, read_sidecar
from dmae_fast.export.pipeline import writable_directory
from dmae_fast.run.host import device_name
from dmae_fast.stats.procedure import CERTIFY, Procedure, ProcedureSpec


def _variants(config: BenchConfig, device: torch.device) -> tuple[list[Variant], list[Variant]]:
    """(every variant, the subset swept over batch sizes); fp32 on the CPU."""
    half = (config.precisions or ("fp16", "bf16")) if device.type == "cuda" else ("fp32",)  # fp8: when named
    mode = config.compile_mode

    def fast(fused=False, compiled=False, graphs=False):
        return FastPath(fused=fused, compile=compiled, compile_mode=mode, cuda_graphs=graphs)

    ours = [Variant("ours: eager", p, fast()) for p in half]
    if device.type == "cuda":  # the same eager body on fp32 weights under autocast (the plain body's way)
        ours.append(Variant("ours: autocast", half[0], FastPath(compile_mode=mode, autocast=True)))
    ours += [Variant("ours: compiled", half[0], fast(compiled=True)),
             Variant("ours: compiled + CUDA graphs", half[0], fast(compiled=True, graphs=True)),
             Variant("ours: fused + CUDA graphs", half[0], fast(fused=True, graphs=True))]
    ours += [Variant("ours: fused + compiled + CUDA graphs", p, fast(True, True, True)) for p in half]
    if device.type != "cuda":
        ours = [Variant("ours: fused", "fp32", fast(fused=True))] + ours
    if config.variants:
        ours = [v for v in ours if variant_key(v.name) in config.variants]
    sweep = [v for v in ours if v.name in ("ours: eager", "ours: fused + CUDA graphs", "ours: fused")
             and v.precision == half[0]]
    return ours, sweep


def _engine_variants(config: BenchConfig, device: torch.device) -> list[tuple[str, Variant]]:
    """(model name, variant) for each --engines file; its classifier decides the model column."""
    out = []
    for path in map(Path, config.engines):
        _check_engine_file(path)
        engine = open_engine(path, EngineOptions(device=str(device)))
        out.append((path.name, Variant(f"engine: {engine.description}", engine.precision, engine=engine)))
    return out


def _check_engine_file(path: Path) -> None:
    """--engines takes image-input engine files (timed through the plain body), nothing else."""
    if path.suffix not in KIND_BY_SUFFIX:
        raise UserError(f"--engines {path}: not an engine file ({', '.join(KIND_BY_SUFFIX)} with its JSON sidecar, "
                        "written by dmae-export)")
    if path.is_file() and read_sidecar(path).input != "image":
        raise UserError(f"--engines {path}: a token-input engine; dmae-bench times image-input engines "
                        "(export with --input image)")


class _Budget:
    """The run's deadline; ``reserve`` seconds are kept back (for the CERTIFY timing)."""

    def __init__(self, seconds: float, reserve: float = 0.0) -> None:
        self.deadline = time.perf_counter() + seconds
        self.reserve = reserve

    def allows(self, needed: float) -> bool:
        return time.perf_counter() + needed + self.reserve < self.deadline


def _certify_reserve(config: BenchConfig, device: torch.device) -> float:
    """Seconds the CERTIFY timing needs: two reference loops and ours (compiling on CUDA)."""
    return 2 * (config.reference_budget_s + 10) + (60 if device.type == "cuda" else 5) if config.certify else 0.0


def _skipped(model: str, variant: Variant, batch: int, why: str) -> Row:
    return Row(model, variant.name, variant.precision, batch, status=f"skipped: {why}")


def _measure(config: BenchConfig, model_name: str, model, variant: Variant, batch: int, peak: float,
             budget: _Budget) -> Row:
    raise_if_interrupted()  # a signal the previous row's compiled code swallowed ends the run here
    compiled = variant.fast is not None and variant.fast.compile
    if compiled and not config.smoke and next(model.parameters()).device.type != "cuda":
        return _skipped(model_name, variant, batch, "torch.compile is only timed on CUDA")
    if compiled and config.smoke:
        return _skipped(model_name, variant, batch, "CPU smoke run (compiling takes minutes on a CPU)")
    if not budget.allows(config.seconds + (60 if compiled else 5)):
        return _skipped(model_name, variant, batch, "time budget")
    print(f"{PROG}: {model_name} {variant.name} {variant.precision} batch {batch}", file=sys.stderr)
    try:
        return measure(model_name, model, variant, batch, config.seconds, peak)
    except UserError:
        raise
    except Exception as error:  # one failing row (a compiler bug, a missing kernel) must not lose the others
        message = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        return Row(model_name, variant.name, variant.precision, batch, status=f"failed: {message}")


def _throughput(config: BenchConfig, device: torch.device, peak: float, budget: _Budget, save,
                folder: Path, exports: list[bench_engines.ExportRecord],
                engine_variants: list[tuple[str, Variant]]) -> list[Row]:
    ours, sweep = _variants(config, device)
    rows: list[Row] = []
    models = {}
    for name in config.models:  # every variant at the main batch first: the table's core
        model = models[name] = build_model(name, device)
        for loop in (COHEN, DMAE):
            rows.append(_measure(config, name, model, Variant(loop.name, loop.precision, reference=loop),
                                 loop.batch_size, peak, budget))
        for variant in ours:
            rows.append(_measure(config, name, model, variant, config.main_batch, peak, budget))
        save(rows)
    for name, variant in engine_variants:
        rows.append(_measure_engine(config, name, variant, peak, budget))
    save(rows)
    for plan in bench_engines.plans(config.export_models, device, config.smoke):
        if plan.model not in models:
            models[plan.model] = build_model(plan.model, device)
        rows += _exported(config, plan, models[plan.model], device, peak, budget, folder, exports)
        save(rows)
    for name in config.models:  # then the batch sweep, smallest batches first, stopping at out of memory
        for variant in sweep:
            for batch in config.batches:
                if batch == config.main_batch:
                    continue
                row = _measure(config, name, models[name], variant, batch, peak, budget)
                rows.append(row)
                if row.status == "out of memory":
                    break
        save(rows)
    return rows


def _exported(config: BenchConfig, plan: bench_engines.EnginePlan, model, device: torch.device, peak: float,
              budget: _Budget, folder: Path, exports: list[bench_engines.ExportRecord]) -> list[Row]:
    """Export one engine (recording its parity) and time it: an image engine through the plain
    body; a token engine behind the fused front end (and, on CUDA, under a CUDA graph)."""
    if plan.input == "image":
        variants = [Variant(f"engine: {plan.label}", plan.precision)]
    else:
        fused = f"ours: fused + {plan.label}"
        variants = [Variant(fused, plan.precision, fast=FastPath(fused=True))]
        if device.type == "cuda":
            variants.append(Variant(f"{fused} + CUDA graphs", plan.precision,
                                    fast=FastPath(fused=True, cuda_graphs=True)))
    onnx_reason = bench_engines.onnx_unavailable_reason(device) if plan.format == "onnx" else None
    if onnx_reason == "onnxruntime is not installed":
        return [_skipped(plan.model, v, config.main_batch, onnx_reason) for v in variants]
    record = bench_engines.record_for(plan, "skipped: time budget")
    if budget.allows(plan.estimate_s(device)):
        print(f"{PROG}: exporting {plan.model} {plan.label} {plan.precision}", file=sys.stderr)
        batch = BatchRange(1, config.main_batch, max(config.main_batch, *config.batches))
        record = bench_engines.export(plan, model, folder, batch, device)
    exports.append(record)
    if record.status != "ok":
        return [_skipped(plan.model, v, config.main_batch, f"export {record.status}") for v in variants]
    if onnx_reason is not None:  # parity was measured on the CPU; a CPU throughput says nothing here
        return [_skipped(plan.model, v, config.main_batch, onnx_reason) for v in variants]
    engine = open_engine(record.path, EngineOptions(device=str(device), input=plan.input))
    rows = []
    for variant in variants:
        variant = replace(variant, engine=engine)
        rows.append(_measure(config, plan.model, model, variant, config.main_batch, peak, budget))
    return rows


def _measure_engine(config: BenchConfig, name: str, variant: Variant, peak: float, budget: _Budget) -> Row:
    engine = variant.engine
    model = torch.nn.Linear(1, 1).to(engine.device)  # only carries the device for ``measure``
    model.spec = engine.spec
    return _measure(config, name, model, variant, config.main_batch, peak, budget)


# --sequential is timed on this many times the images (the same pictures under new indices: new noise).
# It stops after a fraction of n, and with few images the device waits on the decisions between
# looks instead of drawing (an H100, 2026-11-27: 16 random-weight images, ~680 samples each, drew
# 5,108 samples/s against fixed-n's 12,116); a 1,000-image run keeps every slot busy.
SEQUENTIAL_IMAGES = 8


def _certify(config: BenchConfig, device: torch.device, budget: _Budget) -> list[CertifyTiming]:
    name = config.certify_model
    model = build_model(name, device)
    sigma = 0.25
    generator = torch.Generator().manual_seed(0)
    images = [torch.rand(model.spec.input_shape, generator=generator).to(device) for _ in range(config.images)]
    timings = []
    for loop in (COHEN, DMAE):
        if budget.allows(config.reference_budget_s + 10):
            print(f"{PROG}: certify timing, {loop.name}", file=sys.stderr)
            timings.append(time_reference(name, model, loop, images, config.n0, config.n, sigma,
                                          config.reference_budget_s))
    cuda = device.type == "cuda"
    fast = FastPath(fused=True, compile=cuda, compile_mode=config.compile_mode, cuda_graphs=cuda)
    precision = (config.precisions or ("fp16",))[0] if cuda else "fp32"  # the first named (--precisions fp8)
    if budget.allows(30 if cuda else 5):
        print(f"{PROG}: certify timing, ours ({fast.describe()})", file=sys.stderr)
        batch = config.main_batch if config.smoke else 1024
        timings.append(time_ours(name, model, fast, precision, batch, images, config.n0, config.n, sigma))
        if budget.allows(10 if cuda else 5):  # what --sequential runs (--n as the cap)
            sequential = Procedure(ProcedureSpec(CERTIFY, config.n, 0.001, sigma, config.n0, sequential=True))
            again = [images[i % len(images)] for i in range(SEQUENTIAL_IMAGES * len(images))]
            timings.append(time_ours(name, model, fast, precision, batch, again, config.n0, config.n, sigma,
                                     sequential))
    return timings


def _meta(config: BenchConfig, device: torch.device, peaks: dict[str, float]) -> dict:
    versions = {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        versions["cuda"] = torch.version.cuda
    notes = ["CPU smoke run: the numbers say nothing about GPU speed."] if config.smoke else []
    return {"format": "dmae-bench/1", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": device_name(device), "versions": versions, "matmul_peak_flops": peaks,
            "mfu_peak": max(peaks, key=peaks.get), "config": {k: v for k, v in vars(config).items()},
            "notes": notes}


def run_bench(config: BenchConfig) -> int:
    """The whole run: throughput table, exported engines, CERTIFY timing; writes the results files."""
    config.validate()
    out = Path(config.out)
    device = resolve_device(config.device)
    engine_variants = _engine_variants(config, device)  # bad --engines files fail before any timing
    writable_directory(out, "--out", create=False)  # so do output locations that cannot be written
    engine_dir = Path(config.engine_dir or out)
    if config.throughput and config.export_models:
        writable_directory(engine_dir, "--engine-dir", create=False)
    budget = _Budget(config.budget_s, reserve=_certify_reserve(config, device))
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16} if device.type == "cuda" else {"fp32": torch.float32}
    peaks = {name: matmul_peak(device, dtype, seconds=1.0 if not config.smoke else 0.2)
             for name, dtype in dtypes.items()}
    meta = _meta(config, device, peaks)
    suffix = "" if config.throughput and config.certify else ("-throughput" if config.throughput else "-certify")
    stem = report.result_stem(out, device, suffix, engine_dir)
    rows: list[Row] = []
    timings: list[CertifyTiming] = []
    exports: list[bench_engines.ExportRecord] = []
    engine_folder = engine_dir / f"{stem}-engines"

    def save(current_rows: list[Row]) -> list[Path]:
        add_ratios(current_rows)
        return report.write(out, stem, meta, current_rows, timings, exports)

    if config.throughput:
        rows = _throughput(config, device, peaks[meta["mfu_peak"]], budget, save, engine_folder, exports,
                           engine_variants)
    if config.certify:
        budget.reserve = 0.0
        timings.extend(_certify(config, device, budget))
    paths = save(rows)
    print(report.markdown(meta, rows, timings, exports))
    print(f"{PROG}: wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return 0
