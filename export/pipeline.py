"""One export run: checkpoint -> graph -> engine file -> verification -> sidecar.

Each engine is written under a temporary ``<name>.partial<ext>`` name, run against the
fp32 PyTorch model (:mod:`.parity`), and only renamed to ``<name><ext>`` (with its
sidecar) when it passes; a failing engine is deleted and the run exits non-zero. Before
any of that, the options and the output location are checked, and no existing file is
replaced without --overwrite (the checkpoint and directories never).
"""

from __future__ import annotations

import dataclasses
import importlib.util
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
from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import file_sha256
from dmae_fast.demo_files import DEMO, DEMO_CHECKPOINT
from dmae_fast.engines.aoti_engine import aoti_torch_problem
from dmae_fast.engines.exported import ExportedEngine
from dmae_fast.engines.front_end import front_end_path, write_front_end
from dmae_fast.engines.graphs import build_graph, example_input
from dmae_fast.engines.opening import engine_class, resolve_device
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
from dmae_fast.export.agreement import AgreementCheck
from dmae_fast.export.aoti_export import write_pt2
from dmae_fast.export.config import FORMATS, MAX_INPUT_SIZE, ExportConfig
from dmae_fast.export.onnx_export import write_onnx
from dmae_fast.export.parity import measure_parity
from dmae_fast.export.tensorrt_build import (
    TensorRTBuild,
    build_engine,
    check_tensorrt_operators,
)
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.model.classifier import SmoothingClassifier

KIND_BY_FORMAT = {"onnx": "onnx", "tensorrt": "tensorrt", "torch": "aoti"}
Report = Callable[[str], None]


def _note(message: str) -> None:
    print(f"dmae-export: {message}", file=sys.stderr)


def export_engines(config: ExportConfig, report: Report = print, note: Report = _note) -> list[Path]:
    """Write and verify every requested engine; returns the engine paths."""
    config.validate()
    ckpt = DEMO_CHECKPOINT if config.ckpt == DEMO else Path(config.ckpt)
    _check_timing_cache(config, ckpt)
    device = resolve_device(config.device)
    formats = _formats(config, device, note)
    model = load_classifier(ckpt, input_size=config.input_size, mean=config.mean, std=config.std).to(device)
    _check_input_size(model.spec.input_size, config)
    out = writable_directory(Path(config.out), "--out")
    name = config.name or _default_name(ckpt, config)
    targets = [out / (name + SUFFIX_BY_KIND[KIND_BY_FORMAT[fmt]]) for fmt in formats]
    _check_targets(targets, ckpt, config)
    check = _agreement_check(model, config, formats)  # before any export: a bad DATA or sigma wastes no compile
    for fmt, target in zip(formats, targets):
        _export_one(fmt, model, ckpt, target, config, device, report, check)
    return targets


def writable_directory(path: Path, option: str, create: bool = True) -> Path:
    """Check that ``path`` is, or can become, a directory this process writes in (its nearest
    existing ancestor is a directory that takes a new file), else a one-line error naming
    ``option``; ``create`` makes it now. Checked before any slow work, so that a bad output
    location does not fail only after minutes of compiling or timing (also used by dmae-bench).
    """
    existing = next(p for p in (path, *path.parents) if p.exists())
    if existing == path and not path.is_dir():
        raise UserError(f"{option} {path} is a file; name a directory")
    if not existing.is_dir():
        raise UserError(f"cannot create {option} directory {path}: {existing} is a file")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
        if create:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot write in {option} directory {path}: {error.strerror or error}") from None
    return path


def _companions(engine: Path, config: ExportConfig) -> tuple[Path, ...]:
    """The files one engine writes: itself, its sidecar and, for token engines, its front end."""
    return (engine, sidecar_path(engine)) + ((front_end_path(engine),) if config.input == "tokens" else ())


def _check_targets(targets: list[Path], ckpt: Path, config: ExportConfig) -> None:
    """Nothing of the user's is replaced: never the checkpoint or a directory, and without
    --overwrite no existing file at all."""
    for path in (p for target in targets for p in _companions(target, config)):
        if not os.path.lexists(path):
            continue
        if path.exists() and path.samefile(ckpt):
            raise UserError(f"{path} is the checkpoint being exported; choose another --name or --out")
        if path.is_dir():
            raise UserError(f"{path} is a directory; move it or choose another --name or --out")
        if not config.overwrite:
            raise UserError(f"{path} exists; pass --overwrite to replace it")


def _check_timing_cache(config: ExportConfig, ckpt: Path) -> None:
    """An explicit --timing-cache is read and rewritten after the build: it must be a file (or
    not exist yet) in an existing directory, and not the checkpoint."""
    if config.timing_cache is None:
        return
    cache = Path(config.timing_cache)
    if cache.is_dir():
        raise UserError(f"--timing-cache {cache} is a directory; name a file")
    if not cache.parent.is_dir():
        raise UserError(f"--timing-cache {cache}: directory {cache.parent} does not exist")
    if cache.exists() and cache.samefile(ckpt):
        raise UserError(f"--timing-cache {cache} is the checkpoint being exported; name another file")


def _check_input_size(size: int, config: ExportConfig) -> None:
    """The graph and the verification inputs hold [input size]-sided arrays (bicubic resize
    matrices, images): refuse sizes no classifier uses before they exhaust the memory."""
    if size > MAX_INPUT_SIZE:
        source = "--input-size" if config.input_size is not None else f"the checkpoint's input size ({config.ckpt})"
        raise UserError(f"{source} must be at most {MAX_INPUT_SIZE}, got {size}")


def _formats(config: ExportConfig, device: torch.device, note: Report) -> list[str]:
    formats = [f for f in FORMATS if f in config.formats]
    problem = aoti_torch_problem() if "torch" in formats else None
    if problem is not None:  # before compiling: the verification would load it in this process
        if config.strict_formats:
            raise UserError(f"--format torch: {problem}")
        note(f"skipping --format torch: {problem}")
        formats.remove("torch")
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
                device: torch.device, report: Report, check: AgreementCheck | None = None) -> None:
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
        if parity is not None and not parity.passed:
            raise UserError(f"{target.name} failed verification against PyTorch: {parity.summary()}; "
                            "the engine was not kept")
        if check is not None:
            meta = dataclasses.replace(meta, agreement=check.measure(_runner(partial, meta, device)))
        meta = dataclasses.replace(meta, parity=parity)
        _commit(partial, target, meta, model, config)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    verified = "not verified (ONNX Runtime is not installed)" if parity is None else parity.summary()
    agreement = "" if meta.agreement is None else f"; {meta.agreement.summary()}"
    report(f"wrote {target} (+ .json): {fmt} {config.precision}, {config.input} input "
           f"{list(meta.input_shape)}, batch {config.batch}, {time.perf_counter() - start:.1f} s; {verified}"
           f"{agreement}")


def _commit(partial: Path, target: Path, meta: EngineMeta, model: SmoothingClassifier, config: ExportConfig) -> None:
    """Move a verified engine into place with its sidecar (and a token engine's front end).

    Everything is written first (in a scratch folder beside the target); then the old
    sidecar goes, and the moves follow with the new sidecar last. A failed or interrupted
    commit thus leaves at worst an engine without a sidecar, which no reader accepts, never
    an engine beside an older engine's sidecar or front end; files already moved are removed.
    """
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.", dir=target.parent) as scratch:
        staged = Path(scratch) / target.name
        moves = [(partial, target)]
        if config.input == "tokens":  # what a fused front end needs to feed the engine
            moves.append((write_front_end(model, staged), front_end_path(target)))
        meta = dataclasses.replace(meta, sha256=file_sha256(partial))  # checked whenever the engine is opened
        moves.append((write_sidecar(staged, meta), sidecar_path(target)))
        sidecar_path(target).unlink(missing_ok=True)
        moved: list[Path] = []
        try:
            for source, destination in moves:
                os.replace(source, destination)
                moved.append(destination)
        except BaseException:
            for path in moved:
                path.unlink(missing_ok=True)
            raise


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


def _agreement_check(model: SmoothingClassifier, config: ExportConfig, formats: list[str]) -> AgreementCheck | None:
    """--check-agreement's data opened and its sigma resolved (the checkpoint's unless --sigma); None: not asked."""
    if config.check_agreement is None:
        return None
    if "onnx" in formats and importlib.util.find_spec("onnxruntime") is None:
        raise UserError("--check-agreement runs the ONNX engine, and ONNX Runtime is not installed "
                        "(pip install 'dmae-fast[onnx]')")
    sigma = config.sigma if config.sigma is not None else model.spec.sigma
    if sigma is None:
        raise UserError(f"--check-agreement needs a noise level: {config.ckpt} records no sigma; pass --sigma")
    return AgreementCheck(model, config.check_agreement, config.agreement_images, config.agreement_samples, sigma,
                          config.seed)


def _verify(engine: Path, meta: EngineMeta, model: SmoothingClassifier, config: ExportConfig,
            device: torch.device) -> Parity | None:
    """Run the engine where its runtime is available; None when ONNX Runtime is missing."""
    if meta.kind == "onnx":
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return None
    return measure_parity(model, _runner(engine, meta, device), config.parity_samples, config.seed)


def _runner(engine: Path, meta: EngineMeta, device: torch.device) -> ExportedEngine:
    """The just-written engine, opened to be checked (ONNX: on the best provider available)."""
    return engine_class(meta.kind)(engine, meta, "auto" if meta.kind == "onnx" else str(device))
