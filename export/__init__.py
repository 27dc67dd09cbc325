"""Checkpoint -> ONNX / TensorRT / AOTInductor engine files (installed as ``dmae_fast.export``).

``export_engines(ExportConfig(...))`` is what ``dmae-export`` runs; docs/export.md describes
the engine kinds and the sidecar format (:mod:`dmae_fast.engines.sidecar`). The names are
loaded on first use, so that ``dmae-export``'s parser imports :mod:`.config` without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dmae_fast.base.lazy import lazy_attributes

_HOME = {"ExportConfig": "config", "export_engines": "pipeline"}
__all__ = sorted(_HOME)

if TYPE_CHECKING:  # the lazy names, for type checkers (unused here, hence noqa: F401)
    from dmae_fast.export.config import ExportConfig  # noqa: F401
    from dmae_fast.export.pipeline import export_engines  # noqa: F401

__getattr__ = lazy_attributes(__name__, _HOME)
