"""The CPU fast path's graphs: a checkpoint exported to ONNX in memory and checked against PyTorch, both
kept in the model cache (:mod:`dmae_fast.batching.cpu.cache_keys`) so that a later start with the same checkpoint,
libraries and settings skips them. The runtimes that run them: :mod:`dmae_fast.batching.cpu.runtimes`."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import torch

from dmae_fast.base.disk_cache import DiskCache
from dmae_fast.base.integrity import tensors_sha256
from dmae_fast.batching.cpu.cache_keys import cache_key, files_sha256
from dmae_fast.engines.agreement import compare_logits
from dmae_fast.engines.graphs import OPSET, ImageGraph, PatchGraph, pooled_tail_applies
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.noise.patch_layout import PatchLayout

# A runtime's classifier built from a checkpoint must give the checkpoint's logits.
PARITY_TOLERANCE = 1e-3


class GraphChunks(Protocol):
    """A runtime running an exported graph: logits of a chunk in the graph's input ``layout``."""

    layout: PatchLayout | None

    def logits(self, chunk: torch.Tensor) -> torch.Tensor: ...


Chunks = TypeVar("Chunks", bound=GraphChunks)


def onnx_bytes(model: SmoothingClassifier, layout: PatchLayout | None = None) -> bytes:
    """The checkpoint's classifier as an in-memory fp32 ONNX graph: the exporter's image graph, or with a ``layout``
    its patch-input graph, with the last MLP layer after the pool where that applies (:mod:`.graphs`)."""
    pooled_tail = pooled_tail_applies(model)
    graph = ImageGraph(model, "fp32", pooled_tail) if layout is None else PatchGraph(model, layout, pooled_tail)
    graph.eval()
    example = torch.rand((2, *model.spec.input_shape), generator=torch.Generator().manual_seed(0))
    name = "images" if layout is None else "patches"
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer chatter
        torch.onnx.export(graph, (example if layout is None else layout.inputs(example),), buffer, input_names=[name],
                          output_names=["logits"], dynamic_axes={name: {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=OPSET, dynamo=False)
    return buffer.getvalue()


def cached_onnx_bytes(model: SmoothingClassifier, layout: PatchLayout | None, cache: DiskCache) -> bytes:
    """:func:`onnx_bytes` through the model cache: exported and stored on a miss."""
    key = cache_key(what="onnx graph", weights=tensors_sha256(model.state_dict()), spec=model.spec.to_json_dict(),
                    layout=None if layout is None else dataclasses.asdict(layout), precision="fp32")
    graph = cache.read(key)
    if graph is None:
        graph = onnx_bytes(model, layout)
        cache.write(key, graph)
    return graph


def cached_check(build: Callable[[], Chunks], model: SmoothingClassifier, sigma: float, runtime: str,
                 cache: DiskCache, key: str, compiled: Path | None) -> Chunks:
    """``build()``'s chunks, :func:`checked` unless the cache's entry ``key`` records that they passed the check.
    OpenVINO's compiled models (folder ``compiled``) are trusted only as recorded there (SHA-256 of each file):
    where one differs or is missing all are compiled and checked again; a file recorded nowhere is dropped."""
    entry = cache.read(key)
    recorded = None if entry is None else json.loads(entry)
    found = {} if compiled is None else files_sha256(compiled)
    if recorded is not None and all(found.get(name) == digest for name, digest in recorded.items()):
        for name in found.keys() - recorded.keys():
            (compiled / name).unlink(missing_ok=True)
        return build()
    if compiled is not None:
        shutil.rmtree(compiled, ignore_errors=True)
    try:
        chunks = checked(build(), model, sigma, runtime)
    except Exception:
        if compiled is not None:  # the models of a graph that failed its check: no start will use them
            shutil.rmtree(compiled, ignore_errors=True)
        raise
    cache.write(key, json.dumps({} if compiled is None else files_sha256(compiled)).encode())
    return chunks


class ParityMismatch(RuntimeError):
    """An exported graph's logits differ from PyTorch's (the body is then passed over)."""


def checked(chunks: Chunks, model: SmoothingClassifier, sigma: float, runtime: str) -> Chunks:
    """``chunks`` if its logits match the PyTorch model's on noisy inputs (:func:`.agreement.compare_logits`),
    else :class:`ParityMismatch` naming ``runtime``."""
    inputs = None if chunks.layout is None else chunks.layout.inputs
    difference, _ = compare_logits(model, chunks.logits, samples=64, seed=1, batch=64, sigma=sigma, inputs=inputs)
    if not difference <= PARITY_TOLERANCE:
        raise ParityMismatch(f"{runtime} differs from PyTorch by {difference:.2g} on this classifier's logits")
    return chunks
