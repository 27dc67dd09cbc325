"""The CPU batch body of ``dmae-certify --fast``: one worker per core, each noising and classifying its own
cache-sized chunks of the batch (docs/performance.md).

A batch's rows are cut into chunks of up to ``MAX_CHUNK`` rows sized to the L2 cache, as many per worker; each
worker thread makes its chunk's noisy images with the compiled noise kernel (GIL released) and classifies them
with a CPU runtime (:mod:`dmae_fast.batching.cpu.runtimes`) on one core. Small matrix products scale badly across
intra-op threads, so cache-sized chunks on separate cores beat one large forward pass on all cores."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from dmae_fast.batching.cpu.runtimes import ChunkClassifier
from dmae_fast.batching.job import count, keep_class, zero_counts, zero_kept
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stage_timer import StageTimer, count_batch, stage
from dmae_fast.noise.compiled import NoiseSource

DEFAULT_L2_BYTES = 1 << 20
MAX_CHUNK = 128


def l2_cache_bytes() -> int:
    """The per-core L2 cache size from sysfs (Linux), else 1 MiB."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
        return int(text[:-1]) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        return DEFAULT_L2_BYTES


def chunk_rows(model_spec, l2_bytes: int | None = None) -> int:
    """Rows per chunk: the largest power of two, 1 to MAX_CHUNK, whose widest activation (tokens x MLP
    width, fp32) fits four L2 caches (fewer rows pay the per-call overhead, more stream through memory)."""
    encoder = model_spec.encoder
    tokens = 1 + (encoder.img_size // encoder.patch_size) ** 2
    widest = tokens * int(encoder.embed_dim * encoder.mlp_ratio) * 4
    rows = max(1, 4 * (l2_bytes or l2_cache_bytes()) // widest)
    return min(MAX_CHUNK, 1 << (rows.bit_length() - 1))


def cpu_workers() -> int:
    """One worker per core: torch's intra-op thread count (by default the cores this process may use)."""
    return max(1, torch.get_num_threads())


def even_parts(rows: int, chunk: int, workers: int) -> int:
    """How many chunks to cut ``rows`` into: chunks of at most ``chunk`` rows, as many for each
    worker (so that no worker waits for another's extra chunk at the end of a batch)."""
    parts = -(-rows // chunk)
    return min(rows, -(-parts // workers) * workers)


def chunk_sizes(rows: int, chunk: int, workers: int) -> set[int]:
    """The sizes of the chunks ``rows`` rows are cut into (``tensor_split`` into even parts)."""
    parts = even_parts(rows, chunk, workers)
    return {rows // parts, -(-rows // parts)}


class CpuFastBody:
    """A batch body (see :class:`~dmae_fast.batching.stream.BatchBody`) for CPUs."""

    def __init__(self, classifier: ChunkClassifier, smoothing: Smoothing, workers: int, chunk: int, noise: NoiseSource,
                 timer: StageTimer | None = None) -> None:
        self.classifier, self.spec, self.timer = classifier, smoothing.engine.spec, timer
        self.smoothing = smoothing
        if noise.layout != classifier.layout:
            raise ValueError("the noise source must make the classifier's input layout")
        self.workers, self.chunk, self.noise = workers, chunk, noise
        self.device = torch.device("cpu")
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dmae-cpu")
        self._main_threads = torch.get_num_threads()
        self._settled = False  # whether a first chunk has run (see run)
        self._kept: torch.Tensor | None = None

    @property
    def description(self) -> str:
        return (f"{self.classifier.description} on cpu, {self.workers} worker(s) x 1 thread, chunks of {self.chunk}, "
                f"{self.noise.description}")

    def allocate(self, num_slots: int, phase_ids: torch.Tensor) -> torch.Tensor:
        layout = self.classifier.layout
        self._slots = torch.zeros((num_slots, *(self.spec.input_shape if layout is None else layout.row_shape)))
        self._phase_ids = phase_ids
        self._counts = zero_counts(num_slots, len(phase_ids), self.spec.num_classes, self.device)
        self._ones = torch.ones(self.smoothing.batch_size, dtype=torch.int64)
        self._kept = None
        return self._counts

    def keep_classes(self, num_slots: int, samples: int) -> torch.Tensor:
        """Also keep each row's class of the first ``samples`` estimation samples of every image."""
        self._kept = zero_kept(num_slots, samples, self.device)
        return self._kept

    def load(self, slot: int, image: torch.Tensor) -> None:
        layout = self.classifier.layout
        self._slots[slot].copy_(image if layout is None else layout.arrange(image))

    @torch.inference_mode()
    def run(self, slot: torch.Tensor, index: torch.Tensor, position: torch.Tensor, sample: torch.Tensor) -> None:
        """Noise and classify the batch's chunks on the workers, then count. Timed (``--profile``), the workers'
        time is the body's: each worker makes its chunk's noise and classifies it, interleaved."""
        parts = even_parts(len(slot), self.chunk, self.workers)
        columns = (slot, index, self._phase_ids[position], sample)
        chunks = list(zip(*(column.tensor_split(parts) for column in columns)))
        predicted = []
        count_batch(self.timer)
        with stage(self.timer, "body"):
            if not self._settled:
                # The first chunk runs alone: it compiles and checks the noise kernel, and makes the runtime's first
                # inference, whose one-time set-up is not thread-safe (two at once have deadlocked OpenVINO's
                # binding).
                predicted.append(self._pool.submit(self._classify_chunk, chunks.pop(0)).result())
                self._settled = True
            predicted += self._pool.map(self._classify_chunk, chunks)
        with stage(self.timer, "counting"):
            classes = torch.cat(predicted)
            count(self._counts, slot, position, classes, self._ones)
            if self._kept is not None:
                keep_class(self._kept, slot, self._phase_ids[position], sample, classes)

    @torch.inference_mode()
    def _classify_chunk(self, rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """On a worker: this chunk's noisy images, then their classes, on one core."""
        torch.set_num_threads(1)  # this worker's own intra-op threads (torch-op noise, PyTorch classifier)
        slot, index, phase, sample = rows
        noisy = self.noise(self._slots, slot, self.smoothing.sigma, self.smoothing.seed, index, phase, sample)
        return self.classifier.classify(noisy)

    def finish(self) -> None:
        """After a run: restore the process's intra-op thread count (the workers set their own)."""
        torch.set_num_threads(self._main_threads)
