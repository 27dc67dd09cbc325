"""Graph -> ``.onnx``: dynamic batch axis, one input, output "logits", checked by onnx.checker."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from dmae_fast.base.errors import UserError
from dmae_fast.engines.graphs import OPSET
from dmae_fast.engines.sidecar import EMBEDDED_KEY, OUTPUT_NAME


def import_onnx() -> ModuleType:
    try:
        import onnx
    except ImportError:
        raise UserError("ONNX export needs the onnx package: pip install onnx onnxruntime") from None
    return onnx


def write_onnx(graph: nn.Module, example: torch.Tensor, path: Path, input_name: str,
               embedded: dict, opset: int = OPSET) -> None:
    """Export with the TorchScript-based exporter (no onnxscript needed), then validate.

    ``embedded`` is stored as JSON in the model's metadata_props under "dmae_fast".
    """
    onnx = import_onnx()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and exporter deprecation chatter
        torch.onnx.export(
            graph, (example,), str(path), input_names=[input_name], output_names=[OUTPUT_NAME],
            dynamic_axes={input_name: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=opset, dynamo=False,
        )
    model = onnx.load(str(path))
    entry = model.metadata_props.add()
    entry.key, entry.value = EMBEDDED_KEY, json.dumps(embedded)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def operators(path: Path) -> set[str]:
    """The operator types of an ONNX file's main graph."""
    return {node.op_type for node in import_onnx().load(str(path)).graph.node}
