"""Engines: base classifiers behind one interface (:class:`Engine`), opened by file type."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dmae_fast.checkpoints import load_classifier
from dmae_fast.engines.base import Engine
from dmae_fast.engines.torch_engine import PRECISIONS, TorchEngine
from dmae_fast.errors import UserError

# Engine files written by `dmae-export` (arrive with the export issue).
EXPORTED_SUFFIXES = {".onnx": "ONNX", ".engine": "TensorRT", ".plan": "TensorRT", ".pt2": "AOTInductor"}


@dataclass(frozen=True)
class EngineOptions:
    """How to open an engine; the checkpoint overrides apply to foreign checkpoints."""

    device: str = "auto"
    precision: str = "auto"  # fp32 on CPU, fp16 on CUDA
    input_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


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
    """Open an engine by file type: checkpoints run in PyTorch; exported kinds come later."""
    path = Path(path)
    kind = EXPORTED_SUFFIXES.get(path.suffix)
    if kind is not None:
        raise UserError(f"{kind} engines ({path.suffix}) are not supported yet; pass a checkpoint")
    device = resolve_device(options.device)
    precision = options.precision
    if precision == "auto":
        precision = "fp16" if device.type == "cuda" else "fp32"
    if precision not in PRECISIONS:
        raise UserError(f"precision must be auto or one of {sorted(PRECISIONS)}, got {precision!r}")
    model = load_classifier(path, input_size=options.input_size, mean=options.mean, std=options.std)
    return TorchEngine(model, device, precision)


__all__ = ["Engine", "EngineOptions", "TorchEngine", "open_engine", "resolve_device"]
