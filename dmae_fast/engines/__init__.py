"""Engines: base classifiers behind one interface (:class:`Engine`), opened by file type.

``.onnx`` (ONNX Runtime), ``.engine``/``.plan`` (TensorRT) and ``.pt2`` (AOTInductor) are engine files written by
``dmae-export``, each with a JSON sidecar; anything else is a checkpoint, run eagerly in PyTorch. The names load on
first use, so that importing :mod:`dmae_fast.engines.sidecar` does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dmae_fast.base.lazy import lazy_attributes

_HOME = {
    "Engine": "base",
    "EngineMeta": "sidecar",
    "EngineOptions": "opening",
    "ExportedEngine": "exported",
    "TorchEngine": "torch_engine",
    "engine_class": "opening",
    "open_engine": "opening",
    "open_engine_file": "opening",
    "resolve_device": "opening",
}
__all__ = sorted(_HOME)

if TYPE_CHECKING:  # the lazy names, for type checkers (unused here, hence noqa: F401)
    from dmae_fast.engines.base import Engine  # noqa: F401
    from dmae_fast.engines.exported import ExportedEngine  # noqa: F401
    from dmae_fast.engines.opening import (  # noqa: F401
        EngineOptions,
        engine_class,
        open_engine,
        open_engine_file,
        resolve_device,
    )
    from dmae_fast.engines.sidecar import EngineMeta  # noqa: F401
    from dmae_fast.engines.torch_engine import TorchEngine  # noqa: F401

__getattr__ = lazy_attributes(__name__, _HOME)
