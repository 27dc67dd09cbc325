"""What every engine file shares: the sidecar's facts, input checks, the batch range."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.engines.base import Engine, TokenBody, predicted_classes
from dmae_fast.engines.front_end import load_front_end
from dmae_fast.engines.sidecar import EngineMeta


def import_runtime(name: str, missing: str) -> ModuleType:
    """The runtime's module ``name`` (imported on first use), or a one-line UserError ``missing``."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise UserError(missing) from None


class ExportedEngine(Engine):
    """Base of the ONNX Runtime, AOTInductor and TensorRT engines: subclasses implement :meth:`_run` (one batch
    inside the batch range -> float32 logits on ``device``); :meth:`logits` checks the input, splits batches above
    ``batch.max`` and pads those below ``batch.min``. A token engine is a :class:`TokenBody` behind its front end."""

    runtime = "?"  # e.g. "ONNX Runtime (CPUExecutionProvider)", set by subclasses

    path: Path
    meta: EngineMeta

    def __init__(self, path: Path, meta: EngineMeta, device: torch.device) -> None:
        self.path = path
        self.meta = meta
        self.spec = meta.spec
        if device.type == "cuda" and device.index is None:  # the current CUDA device, by index (runtimes need one)
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.precision = meta.precision
        self.input = meta.input
        self.input_shape = meta.input_shape

    @property
    def description(self) -> str:
        return f"{self.meta.kind} {self.precision} engine {self.path.name} via {self.runtime} on {self.device}"

    def _run(self, batch: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """float32 inputs [B, *input_shape] on ``device`` -> float32 logits [B, num_classes]."""
        if tuple(inputs.shape[1:]) != self.input_shape or inputs.ndim != 1 + len(self.input_shape):
            raise UserError(f"engine {self.path.name} takes {self.input} inputs of shape "
                            f"[B, {', '.join(map(str, self.input_shape))}], got {list(inputs.shape)}")
        if inputs.dtype != torch.float32 or inputs.device.type != self.device.type:
            raise UserError(f"engine {self.path.name} takes float32 inputs on {self.device}, "
                            f"got {inputs.dtype} on {inputs.device}")
        low, high = self.meta.batch.min, self.meta.batch.max
        if len(inputs) == 0:
            return torch.empty((0, self.spec.num_classes), device=inputs.device)
        outputs = []
        for chunk in inputs.split(high):
            rows = len(chunk)
            if rows < low:
                chunk = torch.cat([chunk, chunk.new_zeros((low - rows, *self.input_shape))])
            outputs.append(self._run(chunk.contiguous())[:rows])
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def classify(self, inputs: torch.Tensor) -> torch.Tensor:
        return predicted_classes(self.logits(inputs))

    def token_body(self) -> TokenBody | None:
        if self.input != "tokens":
            return None
        return TokenBody(load_front_end(self.path, self.meta).to(self.device), self, self.path, self.meta.kind)
