"""One export run: checkpoint -> graph -> engine file -> verification -> sidecar.

Each engine is written under a temporary ``<name>.partial<ext>`` name, run against the
fp32 PyTorch model (:mod:`.parity`), and only renamed to ``<name><ext>`` (with its
sidecar) when it passes; a failing engine is deleted and the run exits non-zero.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from dmae_fast import __version__
from dmae_fast.checkpoints import load_classifier
from dmae_fast.data import DEMO
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines import engine_class, resolve_device
from dmae_fast.engines.front_end import front_end_path, write_front_end
from dmae_fast.engines.sidecar import (
    SUFFIX_BY_KIND,
    BatchRange,
    EngineMeta,
    Parity,
    embedded_fields,
    sidecar_path,
    write_sidecar,
)
from dmae_fast.engines.tensorrt_engine import import_tensorrt
from dmae_fast.errors import UserError
from dmae_fast.export.aoti_export import write_pt2
from dmae_fast.export.config import FORMATS, ExportConfig
from dmae_fast.export.graphs import build_graph, example_input
from dmae_fast.export.onnx_export import write_onnx
from dmae_fast.export.parity import measure_parity
from dmae_fast.export.tensorrt_build import TensorRTBuild, build_engine, check_tensorrt_operators
from dmae_fast.model import SmoothingClassifier

KIND_BY_FORMAT = {"onnx": "onnx", "tensorrt": "tensorrt", "torch": "aoti"}
Report = Callable[[str], None]


def _note(message: str) -> None:
    print(f"dmae-export: {message}", file=sys.stderr)


def export_engines(config: ExportConfig, report: Report = print, note: Report = _note) -> list[Path]:
    """Write and verify every requested engine; returns the engine paths."""
    config.validate()
    ckpt = DEMO_CHECKPOINT if config.ckpt == DEMO else Path(config.ckpt)
    device = resolve_device(config.device)
    formats = _formats(config, device, note)
    model = load_classifier(ckpt, input_size=config.input_size, mean=config.mean, std=config.std).to(device)
    out = _output_directory(Path(config.out))
    name = config.name or _default_name(ckpt, config)
    targets = [out / (name + SUFFIX_BY_KIND[KIND_BY_FORMAT[fmt]]) for fmt in formats]
    if not config.overwrite:
        for existing in (p for t in targets for p in _companions(t, config) if p.exists()):
            raise UserError(f"{existing} exists; pass --overwrite to replace it")
    for fmt, target in zip(formats, targets):
        _export_one(fmt, model, ckpt, target, config, device, report)
    return targets


def _companions(engine: Path, config: ExportConfig) -> tuple[Path, ...]:
    """The files one engine writes: itself, its sidecar and, for token engines, its front end."""
    return (engine, sidecar_path(engine)) + ((front_end_path(engine),) if config.input == "tokens" else ())


def _formats(config: ExportConfig, device: torch.device, note: Report) -> list[str]:
    formats = [f for f in FORMATS if f in config.formats]
    if "tensorrt" not in formats:
        return formats
    try:
        import_tensorrt()
        if device.type != "cuda":
            raise UserError("--format tensorrt needs a CUDA GPU (TensorRT builds for the GPU it runs on); "
                            "none is in use (--device)")
    except UserError as error:
        if config.strict_formats:
            raise
        note(f"skipping TensorRT: {error}")
        formats.remove("tensorrt")
    return formats


def _output_directory(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; name a directory for the engine files")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot create --out directory {out}: {error.strerror}") from None
    return out


def _default_name(ckpt: Path, config: ExportConfig) -> str:
    name = ckpt.name.split(".")[0] or "model"
    return name + ("-tokens" if config.input == "tokens" else "") + ("" if config.precision == "fp32"
                                                                      else f"-{config.precision}")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _versions(fmt: str) -> dict[str, str]:
    versions = {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()}
    for module in ("onnx", "onnxruntime") if fmt in ("onnx", "tensorrt") else ():
        try:
            versions[module] = importlib.import_module(module).__version__
        except ImportError:
            pass
    return versions


def _export_one(fmt: str, model: SmoothingClassifier, ckpt: Path, target: Path, config: ExportConfig,
                device: torch.device, report: Report) -> None:
    start = time.perf_counter()
    partial = target.with_name(f"{target.stem}.partial{target.suffix}")
    graph = build_graph(model, config.input, config.precision).to(device)
    example = example_input(model, config.input, _example_batch(config.batch), device)
    meta = EngineMeta(
        kind=KIND_BY_FORMAT[fmt], file=target.name, input=config.input, precision=config.precision,
        batch=config.batch, spec=model.spec, device=_device_name(device), source_checkpoint=str(ckpt.resolve()),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), versions=_versions(fmt),
    )
    try:
        if fmt == "onnx":
            write_onnx(graph, example, partial, meta.input_name, embedded_fields(meta))
        elif fmt == "torch":
            write_pt2(graph, example, partial, config.batch, embedded_fields(meta))
        else:
            version = _build_tensorrt(graph, example, partial, meta, config, target.parent)
            meta = dataclasses.replace(meta, versions={**meta.versions, "tensorrt": version})
        parity = _verify(partial, meta, model, config, device)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if parity is not None and not parity.passed:
        partial.unlink()
        raise UserError(f"{target.name} failed verification against PyTorch: {parity.summary()}; "
                        "the engine was not kept")
    meta = dataclasses.replace(meta, parity=parity)
    os.replace(partial, target)
    write_sidecar(target, meta)
    if config.input == "tokens":
        write_front_end(model, target)  # what a fused front end needs to feed the engine
    verified = "not verified (ONNX Runtime is not installed)" if parity is None else parity.summary()
    report(f"wrote {target} (+ .json): {fmt} {config.precision}, {config.input} input "
           f"{list(meta.input_shape)}, batch {config.batch}, {time.perf_counter() - start:.1f} s; {verified}")


def _example_batch(batch: BatchRange) -> int:
    """A traced batch inside the range, 2 when possible (torch.export specializes sizes 0 and 1)."""
    return min(max(2, batch.min), batch.max)


def _build_tensorrt(graph, example, engine: Path, meta: EngineMeta, config: ExportConfig, out: Path) -> str:
    cache = Path(config.timing_cache) if config.timing_cache else out / "tensorrt-timing.cache"
    with tempfile.TemporaryDirectory() as scratch:
        onnx_path = Path(scratch) / "graph.onnx"
        write_onnx(graph, example, onnx_path, meta.input_name, embedded_fields(meta))
        check_tensorrt_operators(onnx_path)
        return build_engine(TensorRTBuild(onnx_path, engine, meta.input_name, meta.input_shape, config.batch,
                                          config.precision, cache))


def _verify(engine: Path, meta: EngineMeta, model: SmoothingClassifier, config: ExportConfig,
            device: torch.device) -> Parity | None:
    """Run the engine where its runtime is available; None when ONNX Runtime is missing."""
    if meta.kind == "onnx":
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return None
    runner = engine_class(meta.kind)(engine, meta, "auto" if meta.kind == "onnx" else str(device))
    return measure_parity(model, runner, config.parity_samples, config.seed)
