"""Which batch body runs a certification: the one place that maps options and device to a body.

* plain (default): :class:`~dmae_fast.certification.stream.ImageBatches`, any engine;
* ``--fast`` on a CPU: :class:`~dmae_fast.certification.cpu_batches.ChunkedCpuBatches`
  (compiled noise, one worker per core on cache-sized chunks; OpenVINO, ONNX Runtime or PyTorch body);
* ``--fast`` on CUDA, or any of ``--fused/--compile/--cuda-graphs/--profile``:
  :class:`~dmae_fast.certification.fast_stream.FastBatches`.

A body on the CPU makes the process keep freed memory (:mod:`dmae_fast.memory`).

Every body gives the same counts up to the classifier's floating-point rounding.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from dmae_fast.certification.cpu_batches import (
    ChunkedCpuBatches,
    chunk_rows,
    chunk_sizes,
    cpu_classifier,
    cpu_workers,
)
from dmae_fast.certification.fast_stream import FastBatches, FastPath, StageTimer
from dmae_fast.certification.stream import BatchBody, ImageBatches
from dmae_fast.engines.base import Engine
from dmae_fast.fast_noise import NoiseSource
from dmae_fast.memory import keep_freed_memory


@dataclass(frozen=True)
class BodyOptions:
    """How the batches of a run are computed (none of it changes the results beyond rounding)."""

    fast: bool = False  # the fastest body for the device
    fused: bool = False
    compile: bool = False
    cuda_graphs: bool = False
    noise: str = "compiled"  # "reference": the torch-op noise (slow; for checking)
    workers: int | None = None  # CPU fast path: worker threads (default: one per core)
    chunk: int | None = None  # CPU fast path: rows per chunk (default: fits the L2 cache)
    cpu_runtime: str = "auto"  # CPU fast path: "openvino", "onnxruntime", "torch" (auto: the first installed)
    patch_input: bool = True  # CPU fast path: feed an exported checkpoint patch rows where it allows (else images)

    def gpu_path(self, device_type: str, profiling: bool) -> FastPath | None:
        """The GPU-style fast body's options, or None when it is not the body to use."""
        if self.fast and device_type == "cuda":
            return FastPath(fused=True, compile=True, cuda_graphs=True)
        if self.fused or self.compile or self.cuda_graphs or profiling:
            return FastPath(fused=self.fused, compile=self.compile, cuda_graphs=self.cuda_graphs)
        return None


def _notice(message: str) -> None:
    print(f"dmae-fast: {message}", file=sys.stderr)


def batch_body(engine: Engine, sigma: float, seed: int, batch: int, options: BodyOptions,
               timer: StageTimer | None = None) -> BatchBody:
    """The batch body for ``engine`` and ``options`` (see the module doc)."""
    compiled = options.noise == "compiled"
    if engine.device.type == "cpu":
        keep_freed_memory()
    if options.fast and engine.device.type == "cpu" and timer is None and engine.input == "image":
        ignored = [flag for flag, on in (("--fused", options.fused), ("--compile", options.compile),
                                         ("--cuda-graphs", options.cuda_graphs)) if on]
        if ignored:
            _notice(f"{' and '.join(ignored)} ignored: --fast on a CPU runs its own body (one worker per core, "
                    "an exported graph per worker); drop --fast to use them")
        workers = options.workers or cpu_workers()
        chunk = options.chunk or chunk_rows(engine.spec)
        classifier = cpu_classifier(engine, engine.precision, sigma, _notice, workers, options.cpu_runtime,
                                    chunk_sizes(batch, chunk, workers), options.patch_input)
        # made by each worker for its own chunks, as the classifier takes them
        noise = NoiseSource(engine.device, compiled, serial=True, layout=classifier.layout)
        return ChunkedCpuBatches(classifier, engine.spec, sigma, seed, batch, workers, chunk, noise)
    noise = NoiseSource(engine.device, compiled)
    path = options.gpu_path(engine.device.type, timer is not None)
    if path is not None or engine.input == "tokens":
        return FastBatches(engine, sigma, seed, batch, path or FastPath(), timer, noise)
    return ImageBatches(engine, sigma, seed, batch, noise)
