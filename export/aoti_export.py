"""Graph -> ``.pt2``: torch.export with a dynamic batch dimension, compiled by AOTInductor."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from dmae_fast.engines.sidecar import EMBEDDED_KEY, BatchRange


def write_pt2(graph: nn.Module, example: torch.Tensor, path: Path, batch: BatchRange, embedded: dict) -> None:
    """Compile for the device of ``example``; the package's one model is the default "model".

    ``embedded`` is stored as JSON in the package metadata under "dmae_fast".
    """
    dynamic = None
    if batch.max > batch.min:
        dynamic = ({0: torch.export.Dim("batch", min=batch.min, max=batch.max)},)
    with torch.no_grad():
        program = torch.export.export(graph, (example,), dynamic_shapes=dynamic)
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(path),
            inductor_configs={"aot_inductor.metadata": {EMBEDDED_KEY: json.dumps(embedded)}},
        )
