"""Opening an engine: an exported engine file (by suffix, with its sidecar) or a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import check_file
from dmae_fast.base.paths import check_readable_file
from dmae_fast.engines.base import INPUT_KINDS, Engine
from dmae_fast.engines.exported import ExportedEngine
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX, EngineMeta, read_sidecar, sidecar_path
from dmae_fast.engines.torch_engine import PRECISIONS, TorchEngine
from dmae_fast.model.checkpoints import load_classifier


@dataclass(frozen=True)
class EngineOptions:
    """How to open an engine; the checkpoint overrides apply to foreign checkpoints only. ``input`` is what the
    caller will feed: "image" (the certifier) or "tokens" (a fused noise + patch-embedding front end)."""

    device: str = "auto"
    precision: str = "auto"  # checkpoints: fp32 on CPU, fp16 on CUDA; engine files: as exported
    input_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    input: str = "image"


def resolve_device(name: str) -> torch.device:
    """'auto' -> the first CUDA device if there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name} requested but CUDA is not available on this machine")
    return device


def open_engine(path: str | Path, options: EngineOptions = EngineOptions()) -> Engine:
    """Open an engine file (by suffix, with its sidecar) or a checkpoint (PyTorch)."""
    path = Path(path)
    if options.input not in INPUT_KINDS:
        raise ValueError(f"input must be one of {INPUT_KINDS}, got {options.input!r}")
    if path.suffix in KIND_BY_SUFFIX:
        return open_engine_file(path, options)
    device = resolve_device(options.device)
    auto = "fp16" if device.type == "cuda" else "fp32"
    precision = auto if options.precision == "auto" else options.precision
    if precision not in PRECISIONS:
        raise UserError(f"precision must be auto or one of {sorted(PRECISIONS)}, got {precision!r}")
    model = load_classifier(path, input_size=options.input_size, mean=options.mean, std=options.std)
    if precision == "fp8":
        from dmae_fast.model.fp8 import fp8_problem

        problem = fp8_problem(model, device)
        if problem is not None:
            raise UserError(f"--precision fp8: {problem}")
    return TorchEngine(model, device, precision, input=options.input)


def open_engine_file(path: Path, options: EngineOptions = EngineOptions()) -> ExportedEngine:
    """An exported engine, checked against its sidecar and against what the caller asks for."""
    check_readable_file(path, "engine")
    meta = read_sidecar(path)
    check_file(path, meta.sha256, f"its sidecar {sidecar_path(path).name}")
    check_options(path, meta, options)
    if options.device != "auto":
        resolve_device(options.device)  # a valid name, and CUDA present if asked for
    return engine_class(meta.kind)(path, meta, options.device)


def engine_class(kind: str) -> type[ExportedEngine]:
    """The runtime of an engine kind; each imports its own runtime lazily."""
    if kind == "onnx":
        from dmae_fast.engines.onnx_engine import OnnxEngine

        return OnnxEngine
    if kind == "aoti":
        from dmae_fast.engines.aoti_engine import AOTIEngine

        return AOTIEngine
    from dmae_fast.engines.tensorrt_engine import TensorRTEngine

    return TensorRTEngine


def check_options(path: Path, meta: EngineMeta, options: EngineOptions) -> None:
    """Options that cannot change an exported engine are errors, not silently ignored."""
    if options.input != meta.input:
        hint = ("dmae-certify needs an image engine (export with --input image), or --fast-parts fused for a "
                "token engine" if options.input == "image"
                else "export with --input tokens")
        raise UserError(f"{path.name} is a {meta.input}-input engine; {hint}")
    if options.precision not in ("auto", meta.precision):
        raise UserError(f"{path.name} was exported in {meta.precision}; --precision {options.precision} cannot "
                        "change it (omit --precision, or export again)")
    if options.input_size is not None or options.mean is not None or options.std is not None:
        raise UserError(f"--input-size and --normalize apply to checkpoints; {path.name} has its input size "
                        f"{meta.spec.input_size} and normalization built in")
