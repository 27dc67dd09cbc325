"""TensorRT engines (``.engine``/``.plan``) run by the TensorRT runtime on torch's CUDA tensors.

TensorRT is imported lazily: its wheels come from NVIDIA's package index and need a CUDA GPU. This path was written
from the TensorRT 10 Python API documentation and has not been run on our machines (no TensorRT there)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.engines.exported import ExportedEngine, import_runtime
from dmae_fast.engines.sidecar import OUTPUT_NAME, EngineMeta

TENSORRT_MISSING = ("TensorRT is not installed (pip install tensorrt needs NVIDIA's package index and a CUDA GPU); "
                    "export ONNX or .pt2 instead")


def import_tensorrt() -> ModuleType:
    """``tensorrt``, or the one-line error above."""
    return import_runtime("tensorrt", TENSORRT_MISSING)


class TensorRTEngine(ExportedEngine):
    """Deserializes the engine once; each batch is one ``execute_async_v3`` on torch's current stream."""

    def __init__(self, path: Path, meta: EngineMeta, device: str = "auto") -> None:
        trt = import_tensorrt()
        if not torch.cuda.is_available():
            raise UserError(f"TensorRT engine {path.name} needs a CUDA GPU; none is available")
        resolved = torch.device("cuda" if device == "auto" else device)
        if resolved.type != "cuda":
            raise UserError(f"TensorRT engine {path.name} runs on CUDA only, not on {device}")
        super().__init__(path, meta, resolved)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.trt_runtime = trt.Runtime(self.logger)
        with torch.cuda.device(self.device):
            self.engine = self.trt_runtime.deserialize_cuda_engine(path.read_bytes())
            if self.engine is None:
                raise UserError(f"TensorRT {trt.__version__} cannot deserialize {path} (engines only run with the "
                                f"TensorRT version and GPU model that built them: {meta.versions.get('tensorrt')}, "
                                f"{meta.device})")
            self.context = self.engine.create_execution_context()
        self._check_io(trt)
        self.runtime = f"TensorRT {trt.__version__}"

    def _check_io(self, trt: ModuleType) -> None:
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        expected = (-1, *self.input_shape)
        shape = tuple(self.engine.get_tensor_shape(inputs[0])) if len(inputs) == 1 else None
        if inputs != [self.meta.input_name] or shape != expected:
            raise UserError(f"{self.path} takes {inputs} {shape}; "
                            f"its sidecar promises {self.meta.input_name} {expected}")
        if sorted(names) != sorted([self.meta.input_name, OUTPUT_NAME]):
            raise UserError(f"{self.path} has tensors {names}; expected {self.meta.input_name} and {OUTPUT_NAME}")

    def _run(self, batch: torch.Tensor) -> torch.Tensor:
        logits = torch.empty((len(batch), self.spec.num_classes), dtype=torch.float32, device=self.device)
        self.context.set_input_shape(self.meta.input_name, tuple(batch.shape))
        self.context.set_tensor_address(self.meta.input_name, batch.data_ptr())
        self.context.set_tensor_address(OUTPUT_NAME, logits.data_ptr())
        if not self.context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError(f"TensorRT failed to run {self.path.name} on a batch of {len(batch)}")
        return logits
