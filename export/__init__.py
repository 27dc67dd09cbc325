"""Checkpoint -> ONNX / TensorRT / AOTInductor engine files (installed as ``dmae_fast.export``).

``export_engines(ExportConfig(...))`` is what ``dmae-export`` runs; docs/export.md describes
the engine kinds and the sidecar format (:mod:`dmae_fast.engines.sidecar`).
"""

from dmae_fast.export.config import ExportConfig
from dmae_fast.export.pipeline import export_engines

__all__ = ["ExportConfig", "export_engines"]
