"""AOTInductor packages (``.pt2``): torch.export + AOTInductor, compiled for one device type."""

from __future__ import annotations

from pathlib import Path

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.engines.exported import ExportedEngine
from dmae_fast.engines.sidecar import EMBEDDED_KEY, EngineMeta, check_embedded


class AOTIEngine(ExportedEngine):
    """Runs the package's default model (one input tensor -> the logits tensor)."""

    def __init__(self, path: Path, meta: EngineMeta, device: str = "auto") -> None:
        target = "cpu" if meta.device == "cpu" else "cuda"  # the device type it was compiled for
        resolved = torch.device(target if device == "auto" else device)
        if resolved.type != target:
            raise UserError(f"{path.name} was compiled for {target} ({meta.device}); it cannot run on {device} "
                            f"(export again with dmae-export --format torch --device {resolved.type})")
        if target == "cuda":
            if not torch.cuda.is_available():
                raise UserError(f"{path.name} was compiled for CUDA ({meta.device}) but CUDA is not available here")
            resolved = torch.device("cuda", torch.cuda.current_device() if resolved.index is None else resolved.index)
        super().__init__(path, meta, resolved)
        try:
            # On CUDA one thread calls it: the single-threaded runner neither waits on the previous
            # call's event (a host sync) nor queries events, which a CUDA-graph capture forbids.
            self.package = torch._inductor.aoti_load_package(
                str(path), run_single_threaded=target == "cuda",
                device_index=resolved.index if target == "cuda" else -1)
        except Exception as error:  # a foreign, truncated or incompatible package
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserError(f"cannot load AOTInductor package {path}: {first}") from None
        check_embedded(meta, self.package.get_metadata().get(EMBEDDED_KEY), path)
        self.runtime = f"AOTInductor (torch {torch.__version__})"

    def _run(self, batch: torch.Tensor) -> torch.Tensor:
        return self.package(batch)
