"""The engines ``dmae-bench`` exports itself, with the export pipeline, to time them.

On a GPU: AOTInductor ``.pt2`` fp16 with image input and with token input (the token
engine runs behind the fused front end), compiled for the bench device, and ONNX fp16
(image input). On the CPU (fp32): ONNX with image and token input, plus the ``.pt2``
pair outside smoke runs (AOTInductor compiles for ~20 s even for a tiny model on a CPU).
Each export is verified against PyTorch by the pipeline; its parity figures come from
the sidecar and go into the benchmark record.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.data import DEMO
from dmae_fast.engines.sidecar import BatchRange, read_sidecar
from dmae_fast.export import ExportConfig, export_engines
from dmae_fast.model.checkpoints import save_classifier
from dmae_fast.model.classifier import SmoothingClassifier

LABELS = {"torch": ".pt2", "onnx": "ONNX"}
SUFFIXES = {"torch": ".pt2", "onnx": ".onnx"}
LARGE = ("vit-b16", "vit-l16")  # exports of these take minutes, not seconds
PARITY_SAMPLES = 256
CPU_RUNTIME_PARITY_SAMPLES = 32  # a ViT-B through ONNX Runtime's CPU provider: seconds per batch


@dataclass(frozen=True)
class EnginePlan:
    """One engine file to export: a bench model in one format, input kind and precision."""

    model: str
    format: str  # "torch" (.pt2) or "onnx"
    input: str  # "image" or "tokens"
    precision: str

    @property
    def name(self) -> str:
        return f"{self.model}-{self.input}-{self.precision}"

    @property
    def label(self) -> str:
        return f"{LABELS[self.format]} {self.input}"

    def estimate_s(self, device: torch.device) -> float:
        """Seconds to keep free before starting this export (compile + verification)."""
        large = self.model in LARGE
        if self.format == "torch":
            return 150.0 if large else (40.0 if device.type == "cuda" else 30.0)
        return 60.0 if large else 10.0


@dataclass
class ExportRecord:
    """What one export produced (a table row and a JSON entry of the benchmark)."""

    model: str
    engine: str  # e.g. ".pt2 tokens"
    file: str
    precision: str
    status: str = "ok"  # ok, skipped: <why>, failed: <why>
    export_s: float | None = None
    parity: dict | None = None  # the sidecar's parity block
    path: str | None = None


def record_for(plan: EnginePlan, status: str = "ok") -> ExportRecord:
    return ExportRecord(plan.model, plan.label, plan.name + SUFFIXES[plan.format], plan.precision, status)


def plans(models: tuple[str, ...], device: torch.device, smoke: bool) -> list[EnginePlan]:
    """The engines to export for ``models`` on ``device`` (fp16 on CUDA, fp32 on the CPU)."""
    if device.type == "cuda":
        kinds = [("torch", "image"), ("torch", "tokens"), ("onnx", "image")]
        precision = "fp16"
    else:
        kinds = [("onnx", "image"), ("onnx", "tokens")] + ([] if smoke else [("torch", "image"), ("torch", "tokens")])
        precision = "fp32"
    return [EnginePlan(model, fmt, kind, precision) for model in models for fmt, kind in kinds]


def onnx_unavailable_reason(device: torch.device) -> str | None:
    """Why ONNX Runtime cannot run on ``device`` here (None if it can)."""
    try:
        import onnxruntime
    except ImportError:
        return "onnxruntime is not installed"
    providers = onnxruntime.get_available_providers()
    if device.type == "cuda" and "CUDAExecutionProvider" not in providers:
        return f"onnxruntime has only the {', '.join(providers)} here"
    return None


def export(plan: EnginePlan, model: SmoothingClassifier, folder: Path, batch: BatchRange,
           device: torch.device) -> ExportRecord:
    """Export and verify one engine into ``folder`` (the checkpoint is saved there first)."""
    record = record_for(plan)
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / f"{plan.model}.safetensors"
    if plan.model == DEMO:
        source = DEMO
    else:
        if not checkpoint.exists():
            save_classifier(model, checkpoint)
        source = str(checkpoint)
    samples = PARITY_SAMPLES
    if plan.format == "onnx" and plan.model in LARGE and onnx_unavailable_reason(device) is not None:
        samples = CPU_RUNTIME_PARITY_SAMPLES
    config = ExportConfig(source, str(folder), (plan.format,), plan.precision, plan.input, batch=batch,
                          name=plan.name, device=str(device), parity_samples=samples, seed=0)
    start = time.perf_counter()
    try:
        [path] = export_engines(config, report=_say, note=_say)
    except UserError as error:
        record.status = f"failed: {error}"
        return record
    except Exception as error:  # a compiler or exporter bug must not lose the other rows
        record.status = "failed: " + " ".join(f"{type(error).__name__}: {error}".split())[:200]
        return record
    record.export_s = time.perf_counter() - start
    meta = read_sidecar(path)
    record.parity = None if meta.parity is None else dict(vars(meta.parity))
    record.path = str(path)
    return record


def _say(line: str) -> None:
    print(f"dmae-bench: export: {line}", file=sys.stderr)
