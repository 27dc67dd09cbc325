"""Checkpoint -> ONNX / TensorRT / AOTInductor export (installed as ``dmae_fast.export``).

Arrives with the export issue; ``dmae-certify --engine`` already routes checkpoints.
"""
