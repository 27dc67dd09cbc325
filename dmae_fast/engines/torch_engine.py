"""The PyTorch engine: a checkpoint's classifier run eagerly, optionally under autocast."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch

from dmae_fast.engines.base import Engine, predicted_classes
from dmae_fast.engines.sidecar import input_shape
from dmae_fast.model.classifier import SmoothingClassifier

# the dtype a precision computes in (fp8: the matrix products of the blocks in float8, the rest bf16)
PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


def precision_model(model: SmoothingClassifier, precision: str) -> SmoothingClassifier:
    """The model a precision runs without autocast: fp32 itself, fp16/bf16 a cast copy, fp8 a
    bf16 copy with float8 linear layers (:mod:`dmae_fast.model.fp8`)."""
    if precision == "fp8":
        from dmae_fast.model.fp8 import to_fp8

        return to_fp8(model)
    dtype = PRECISIONS[precision]
    return model if dtype is None else copy.deepcopy(model).to(dtype)


def ieee_fp32_convolutions() -> None:
    """Make cuDNN's float32 convolutions (TF32 by default) IEEE float32 for this process, so that fp32 on a GPU
    means what it means on the CPU; through ``allow_tf32``, since the per-operator ``cudnn.conv.fp32_precision``
    splits conv and RNN flags, which torch.export refuses ("different TF32 flags")."""
    torch.backends.cudnn.allow_tf32 = False


class TorchEngine(Engine):
    """Runs a :class:`SmoothingClassifier` in inference mode; fp16/bf16 via autocast, fp8 on a float8 copy
    (:func:`precision_model`). ``input="tokens"`` runs only the body after the front end (``forward_tokens``)."""

    model: SmoothingClassifier

    def __init__(self, model: SmoothingClassifier, device: torch.device, precision: str = "fp32",
                 input: str = "image") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        if device.type == "cuda" and precision == "fp32":
            ieee_fp32_convolutions()
        self.model = model.eval().to(device)
        self.spec = model.spec
        self.device = device
        self.precision = precision
        self.input = input
        self.input_shape = input_shape(model.spec, input)
        # the model that runs: fp8 needs its quantized copy; fp16/bf16 run the fp32 model under autocast
        self.runs = precision_model(self.model, precision) if precision == "fp8" else self.model
        self._forward = self.runs if input == "image" else self.runs.forward_tokens
        self.description = f"torch eager {precision} on {device}" + (" (token input)" if input == "tokens" else "")

    def cast_model(self) -> SmoothingClassifier:
        """fp8: the float8 copy this engine runs (quantized once); else :func:`precision_model`."""
        return self.runs if self.precision == "fp8" else precision_model(self.model, self.precision)

    @torch.inference_mode()
    def classify(self, inputs: torch.Tensor) -> torch.Tensor:
        dtype = PRECISIONS[self.precision]
        if self.precision == "fp8":  # a cast copy: no autocast
            return predicted_classes(self._forward(inputs.to(dtype)))
        with nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype):
            return predicted_classes(self._forward(inputs))
