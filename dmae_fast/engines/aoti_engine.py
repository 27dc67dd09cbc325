"""AOTInductor packages (``.pt2``): torch.export + AOTInductor, compiled for one device type."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dmae_fast.base.errors import UserError
from dmae_fast.engines.exported import ExportedEngine
from dmae_fast.engines.sidecar import EMBEDDED_KEY, EngineMeta, check_embedded

# below it, ``aoti_load_package`` crashed the process on freshly compiled packages (aoti_torch_problem)
AOTI_MIN_TORCH = (2, 12)
TRY_ANY = "DMAE_FAST_TRY_AOTI"  # set to 1: load on any torch (diagnosing the crash, e.g. under gdb)


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as "2.11.0+cu130" or "2.15.0.dev20261101"."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def aoti_torch_problem(version: str | None = None) -> str | None:
    """Why this torch cannot write or load ``.pt2`` engines (one line), or None (any torch: DMAE_FAST_TRY_AOTI=1)."""
    version = torch.__version__ if version is None else version
    if _release(version) >= AOTI_MIN_TORCH or os.environ.get(TRY_ANY) == "1":
        return None
    need = ".".join(map(str, AOTI_MIN_TORCH))
    return (f"AOTInductor packages (.pt2) need torch >= {need}; this is torch {version}, whose package loader "
            "crashed the process (segmentation fault) on freshly compiled packages (torch 2.11.0, "
            "bench/results/2026-12-02-aoti-torch-2.11); use an ONNX engine (--format onnx) or a newer torch")


class AOTIEngine(ExportedEngine):
    """Runs the package's default model (one input tensor -> the logits tensor)."""

    def __init__(self, path: Path, meta: EngineMeta, device: str = "auto") -> None:
        problem = aoti_torch_problem()
        if problem is not None:  # before any loading: the loader itself is what crashes
            raise UserError(f"cannot load {path.name}: {problem}")
        target = "cpu" if meta.device == "cpu" else "cuda"  # the device type it was compiled for
        resolved = torch.device(target if device == "auto" else device)
        if resolved.type != target:
            raise UserError(f"{path.name} was compiled for {target} ({meta.device}); it cannot run on {device} "
                            f"(export again with dmae-export --format torch --device {resolved.type})")
        if target == "cuda":
            if not torch.cuda.is_available():
                raise UserError(f"{path.name} was compiled for CUDA ({meta.device}) but CUDA is not available here")
        super().__init__(path, meta, resolved)
        try:
            # On CUDA one thread calls it: the single-threaded runner neither waits on the previous
            # call's event (a host sync) nor queries events, which a CUDA-graph capture forbids.
            self.package = torch._inductor.aoti_load_package(
                str(path), run_single_threaded=target == "cuda",
                device_index=self.device.index if target == "cuda" else -1)
        except Exception as error:  # a foreign, truncated or incompatible package
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserError(f"cannot load AOTInductor package {path}: {first}") from None
        check_embedded(meta, self.package.get_metadata().get(EMBEDDED_KEY), path)
        self.runtime = f"AOTInductor (torch {torch.__version__})"

    def _run(self, batch: torch.Tensor) -> torch.Tensor:
        return self.package(batch)
