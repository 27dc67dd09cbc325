"""ONNX engines (``.onnx``) run by ONNX Runtime: TensorRT or CUDA execution provider on a GPU
when the installed ONNX Runtime has them, else the CPU provider."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line
from dmae_fast.engines.exported import ExportedEngine, import_runtime
from dmae_fast.engines.sidecar import EMBEDDED_KEY, OUTPUT_NAME, EngineMeta, check_embedded

ORT_MISSING = "ONNX Runtime is not installed: pip install onnxruntime (CPU) or onnxruntime-gpu (CUDA)"
CUDA_EP, TENSORRT_EP, CPU_EP = "CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider"


def onnx_device(name: str, ort: ModuleType) -> torch.device:
    """'auto' -> CUDA when both torch and ONNX Runtime can use it, else the CPU."""
    has_cuda_ep = CUDA_EP in ort.get_available_providers()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() and has_cuda_ep else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not has_cuda_ep:
        raise UserError(f"device {name}: the installed ONNX Runtime has no CUDA execution provider "
                        "(install onnxruntime-gpu, or use --device cpu)")
    return device


class OnnxEngine(ExportedEngine):
    """Runs an exported ONNX graph; on CUDA through IO binding (no host copies)."""

    def __init__(self, path: Path, meta: EngineMeta, device: str = "auto") -> None:
        ort = import_runtime("onnxruntime", ORT_MISSING)
        super().__init__(path, meta, onnx_device(device, ort))
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = 3  # errors only
        self.session = self._session(ort, options)
        self.runtime = f"ONNX Runtime {ort.__version__} ({self.session.get_providers()[0]})"
        self._check_graph()

    def _session(self, ort: ModuleType, options):
        if self.device.type == "cpu":
            attempts = [[CPU_EP]]
        else:
            cuda = [(CUDA_EP, {"device_id": self.device.index})]
            attempts = [cuda]
            if TENSORRT_EP in ort.get_available_providers() and importlib.util.find_spec("tensorrt"):
                attempts.insert(0, [(TENSORRT_EP, {"device_id": self.device.index})] + cuda)
        for number, providers in enumerate(attempts, 1):
            try:
                return ort.InferenceSession(str(self.path), options, providers=providers)
            except Exception as error:  # ONNX Runtime raises its own exception types
                if number == len(attempts):
                    raise UserError(f"ONNX Runtime cannot load {self.path}: {one_line(error, first=True)}") from None

    def _check_graph(self) -> None:
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        shape = tuple(inputs[0].shape[1:]) if len(inputs) == 1 else None
        if len(inputs) != 1 or inputs[0].name != self.meta.input_name or shape != self.input_shape:
            found = ", ".join(f"{i.name} {i.shape}" for i in inputs)
            raise UserError(f"{self.path} takes {found}; its sidecar promises {self.meta.input_name} "
                            f"[B, {', '.join(map(str, self.input_shape))}]")
        if [o.name for o in outputs] != [OUTPUT_NAME] or outputs[0].shape[-1] != self.spec.num_classes:
            found = ", ".join(f"{o.name} {o.shape}" for o in outputs)
            raise UserError(f"{self.path} outputs {found}; its sidecar promises {OUTPUT_NAME} "
                            f"[B, {self.spec.num_classes}]")
        check_embedded(self.meta, self.session.get_modelmeta().custom_metadata_map.get(EMBEDDED_KEY), self.path)

    def _run(self, batch: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            (logits,) = self.session.run([OUTPUT_NAME], {self.meta.input_name: batch.numpy()})
            return torch.from_numpy(logits)
        # CUDA: ONNX Runtime runs on its own stream, so torch's pending work on the input must
        # finish first; Run() returns once ONNX Runtime's stream has finished the outputs.
        torch.cuda.current_stream(self.device).synchronize()
        logits = torch.empty((len(batch), self.spec.num_classes), dtype=torch.float32, device=self.device)
        binding = self.session.io_binding()
        for name, tensor in ((self.meta.input_name, batch), (OUTPUT_NAME, logits)):
            bind = binding.bind_input if tensor is batch else binding.bind_output
            bind(name, "cuda", self.device.index, np.float32, tuple(tensor.shape), tensor.data_ptr())
        self.session.run_with_iobinding(binding)
        return logits
