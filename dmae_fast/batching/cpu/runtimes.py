"""CPU runtimes for the CPU batch body: the classifier of one chunk of rows, on the calling core.

The classifier (fp32) is the checkpoint exported to ONNX in memory, checked and cached (:mod:`.exported`), or an
fp32 ``.onnx`` engine file, run with one thread per worker by the first runtime installed of OpenVINO, ONNX Runtime
and PyTorch eager (``--cpu-runtime auto``). ``--precision bf16`` runs PyTorch; an fp16/bf16 ``.onnx`` engine runs in
ONNX Runtime. Where a checkpoint's front end allows, the exported graph takes the normalized patch rows the noise
kernel writes (:mod:`dmae_fast.noise.patch_layout`)."""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from dmae_fast.base.disk_cache import DiskCache
from dmae_fast.base.errors import UserError
from dmae_fast.batching.cpu.cache_keys import cache_key
from dmae_fast.batching.cpu.exported import cached_check, cached_onnx_bytes
from dmae_fast.engines.base import Engine, predicted_classes
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.noise.patch_layout import PatchLayout

RUNTIME_NAMES = {"openvino": "OpenVINO", "onnxruntime": "ONNX Runtime", "torch": "PyTorch"}


class ChunkClassifier(Protocol):
    """Classifies one chunk (float32, CPU) on the calling thread's core: images [R, *input_shape],
    or with a ``layout``, normalized patch rows [R, *layout.row_shape]."""

    description: str
    layout: PatchLayout | None

    def classify(self, chunk: torch.Tensor) -> torch.Tensor: ...


class OrtChunks:
    """ONNX Runtime, one intra-op thread per call; ``Run`` is thread-safe and frees the GIL. ``precision``: the
    model's (an fp16 engine file's is fp16; the inputs and logits are float32 either way)."""

    def __init__(self, model: bytes | Path, label: str, layout: PatchLayout | None = None,
                 precision: str = "fp32") -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        source = str(model) if isinstance(model, Path) else model
        self.session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.description, self.layout = f"ONNX Runtime {ort.__version__} {precision} ({label})", layout

    def logits(self, chunk: torch.Tensor) -> torch.Tensor:
        (logits,) = self.session.run(None, {self.input_name: chunk.numpy()})[:1]
        return torch.from_numpy(logits)

    def classify(self, chunk: torch.Tensor) -> torch.Tensor:
        return predicted_classes(self.logits(chunk))


class OpenVinoChunks:
    """OpenVINO's CPU runtime: ``workers`` inference streams of one thread; each worker thread has its own
    infer requests, and ``infer`` frees the GIL. A model compiled for one batch size runs faster than one for
    any, so the chunk sizes of a full batch (``static_rows``) get their own, compiled here; other sizes share
    one compiled for any size, on first use. OpenVINO keeps them in ``cache_dir``."""

    def __init__(self, model: bytes | Path, label: str, workers: int, static_rows: Iterable[int] = (),
                 layout: PatchLayout | None = None, cache_dir: Path | None = None) -> None:
        import openvino as ov

        self._core = openvino_core()
        self._graph = self._core.read_model(model if isinstance(model, bytes) else str(model))
        # unpinned: pinned, the streams of every process (--nproc-per-node, two runs) share the first cores
        self._config = {"INFERENCE_NUM_THREADS": workers, "NUM_STREAMS": workers, "INFERENCE_PRECISION_HINT": "f32",
                        "ENABLE_CPU_PINNING": False}
        if cache_dir is not None:
            self._config["CACHE_DIR"] = str(cache_dir)
        self._compiled: dict[int | None, Any] = {rows: self._compile(rows) for rows in set(static_rows)}
        self._lock, self._local = threading.Lock(), threading.local()
        self.description, self.layout = f"OpenVINO {ov.__version__.split('-')[0]} fp32 ({label})", layout

    def _compile(self, rows: int | None) -> Any:
        """The graph compiled for ``rows`` rows, or for any number (None)."""
        graph = self._graph.clone()
        if rows is not None:
            shape = graph.input(0).get_partial_shape()
            shape[0] = rows
            graph.reshape({0: shape})
        return self._core.compile_model(graph, "CPU", self._config)

    def _request(self, rows: int) -> Any:
        """This thread's infer request for a chunk of ``rows`` rows."""
        key = rows if rows in self._compiled else None
        requests = self._local.__dict__.setdefault("requests", {})
        if key not in requests:
            if key is None:
                with self._lock:
                    if None not in self._compiled:
                        self._compiled[None] = self._compile(None)
            requests[key] = self._compiled[key].create_infer_request()
        return requests[key]

    def logits(self, chunk: torch.Tensor) -> torch.Tensor:
        result = self._request(len(chunk)).infer([chunk.numpy()], share_inputs=True)
        return torch.from_numpy(result[0])

    def classify(self, chunk: torch.Tensor) -> torch.Tensor:
        return predicted_classes(self.logits(chunk))


@functools.cache
def openvino_core():
    """The process's one OpenVINO Core, never freed: freeing the last Core and compiled model unmaps the signal
    stack its CPU plugin gave the calling thread, and a later Ctrl-C or SIGTERM crashes the process (SIGSEGV)."""
    import openvino as ov

    return ov.Core()


class TorchChunks(TorchEngine):
    """The PyTorch engine on the CPU (fp32, bf16 under autocast, or an fp8 copy), on the calling thread."""

    def __init__(self, model: SmoothingClassifier, precision: str) -> None:
        super().__init__(model, torch.device("cpu"), precision)
        self.description, self.layout = f"torch eager {precision}", None


def _installed(runtime: str) -> bool:
    try:
        __import__(runtime)
    except ImportError:
        return False
    return True


def _runtime(requested: str, candidates: tuple[str, ...], what: str, notice) -> str:
    """The requested runtime, or for "auto" the first installed of ``candidates`` (the runtimes
    that can run ``what``, fastest first), with a notice when a faster one is missing."""
    if requested != "auto":
        if requested not in candidates:
            raise UserError(f"--cpu-runtime {requested} does not run {what}; choose from auto, {', '.join(candidates)}")
        if requested != "torch" and not _installed(requested):
            raise UserError(f"--cpu-runtime {requested}: {RUNTIME_NAMES[requested]} is not installed "
                            f"(pip install {requested})")
        return requested
    installed = [runtime for runtime in candidates if runtime == "torch" or _installed(runtime)]
    if not installed:
        raise UserError(f"the CPU fast path needs {' or '.join(RUNTIME_NAMES[r] for r in candidates)} for {what} "
                        f"(pip install {candidates[0]}), or run without --fast")
    if installed[0] != candidates[0]:
        notice(f"{RUNTIME_NAMES[candidates[0]]} is not installed (pip install {candidates[0]}); the CPU fast path "
               f"runs {RUNTIME_NAMES[installed[0]]}")
    return installed[0]


def _exported(model: SmoothingClassifier, layout: PatchLayout | None, sigma: float, runtime: str, workers: int,
              static_rows: Iterable[int], cache: DiskCache) -> OrtChunks | OpenVinoChunks:
    """The checkpoint exported to ONNX and checked, on ``runtime``, through the model cache (module doc)."""
    graph = cached_onnx_bytes(model, layout, cache)
    label = "exported in memory" + ("" if layout is None else f", {layout.patch}x{layout.patch} patch rows in")
    graph_sha256 = hashlib.sha256(graph).hexdigest()
    name = RUNTIME_NAMES[runtime]
    if runtime == "onnxruntime":
        key = cache_key(what="parity verdict", graph=graph_sha256, runtime=runtime, sigma=sigma)
        return cached_check(lambda: OrtChunks(graph, label, layout), model, sigma, name, cache, key, None)
    static_rows = sorted(set(static_rows))
    key = cache_key(what="parity verdict", graph=graph_sha256, runtime=runtime, sigma=sigma, workers=workers,
                    static_rows=static_rows)
    compiled = cache.subfolder("openvino", key)
    return cached_check(lambda: OpenVinoChunks(graph, label, workers, static_rows, layout, compiled), model, sigma,
                        name, cache, key, compiled)


def cpu_classifier(engine: Engine, precision: str, sigma: float, notice, workers: int, runtime: str,
                   static_rows: Iterable[int] = (), patch_input: bool = True,
                   cache_reads: list[Path] | None = None) -> ChunkClassifier:
    """The fastest chunk classifier for an engine on a CPU (see the module doc); ``static_rows``: the chunk sizes most
    chunks will have; ``patch_input``: a checkpoint's exported graph takes patch rows where its front end allows;
    ``cache_reads`` collects the model-cache entries it was built from."""
    model = engine.model
    if model is not None:
        if precision != "fp32":
            _runtime(runtime, ("torch",), f"--precision {precision}", notice)
            return TorchChunks(model, precision)
        chosen = _runtime(runtime, ("openvino", "onnxruntime", "torch"), "fp32 checkpoints", notice)
        if chosen == "torch":
            return TorchChunks(model, precision)
        layout = PatchLayout.of(model) if patch_input else None
        return _exported(model, layout, sigma, chosen, workers, static_rows, DiskCache.open(notice, cache_reads))
    meta, path = engine.meta, engine.path
    if meta is not None and path is not None and meta.kind == "onnx" and meta.input == "image":
        fp32 = meta.precision == "fp32"
        candidates = ("openvino", "onnxruntime") if fp32 else ("onnxruntime",)
        chosen = _runtime(runtime, candidates, f"{meta.precision} .onnx engines", notice)
        if chosen == "openvino":
            return OpenVinoChunks(path, path.name, workers, static_rows)
        return OrtChunks(path, path.name, precision=meta.precision)
    raise UserError(f"the CPU fast path (--fast) runs PyTorch checkpoints and .onnx image engines, not "
                    f"{engine.description}; run without --fast")
