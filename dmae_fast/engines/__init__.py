"""Engines: base classifiers behind one interface (:class:`~dmae_fast.engines.base.Engine`), opened by file type
(:mod:`.opening`).

``.onnx`` (ONNX Runtime), ``.engine``/``.plan`` (TensorRT) and ``.pt2`` (AOTInductor) are engine files written by
``dmae-export``, each with a JSON sidecar (:mod:`.sidecar`, torch-free); anything else is a checkpoint, run eagerly in
PyTorch (:mod:`.torch_engine`)."""
