"""C on a CPU: the sound noise of ``--sound``, bit for bit with :mod:`dmae_fast.sound_noise` (its reference).

Inductor's code for the torch-op lookup costs about a Philox word a gather (bench/results/2026-11-27-sound),
so ``--sound`` ran at half the default noise's speed where the noise is the work. ``sound_noise_cpu.c``
draws the same integers in plain C: Philox in a loop the compiler vectorizes, then a lookup that is one
load and one comparison for almost every element (its header says why it is exact).

The source is compiled once per machine with the system's C compiler (``$CC``, else ``cc``) into the user's
cache (``$XDG_CACHE_HOME/dmae-fast``, else ``~/.cache/dmae-fast``), keyed by the source, the compiler, its
flags and the CPU's features (``-march=native`` builds for this CPU: a home shared by a cluster's nodes keeps
one library per kind of CPU), and called through ctypes, which releases the GIL. :func:`load` returns None
where that fails (no compiler, no writable cache); the caller then runs the compiled torch ops instead, and
names them ("compiled sound noise") where it names the noise.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dmae_fast.stats.rounded_gaussian import SoundTable

SOURCE = Path(__file__).with_name("sound_noise_cpu.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC")
TOP_BITS = 16  # the lookup's buckets: U's top 16 bits

_i64, _i32, _f32 = (np.ctypeslib.ndpointer(t, flags="C_CONTIGUOUS") for t in (np.int64, np.int32, np.float32))
_pointer = ctypes.c_void_p  # arguments that may be NULL


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "dmae-fast"


def _cpu_features() -> bytes:
    """What ``-march=native`` depends on: the CPU's model and feature flags (Linux), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode() + platform.machine().encode()
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))})).encode()


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled library (compiled on first use, then cached on disk), or None where it cannot be built."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    key = [SOURCE.read_bytes(), compiler.encode(), " ".join(FLAGS).encode(), _cpu_features()]
    tag = hashlib.sha256(b"\0".join(key)).hexdigest()[:16]
    try:
        library = _cache_dir() / f"sound_noise_cpu-{tag}.so"
        if not library.exists():
            library.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=library.parent) as scratch:  # built aside, then moved in whole
                built = Path(scratch) / library.name
                subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True, capture_output=True,
                               timeout=120)
                os.replace(built, library)
        handle = ctypes.CDLL(str(library))
    except (OSError, RuntimeError, subprocess.SubprocessError):  # RuntimeError: no home directory
        return None
    function = handle.sound_noise_rows
    function.restype = None
    function.argtypes = [_f32, _i32, ctypes.c_int64, _i64, _i64, _i64, _i64, ctypes.c_int64, _pointer,
                         ctypes.c_uint32, ctypes.c_uint32, _i64, ctypes.c_int64, _i32, ctypes.c_int32,
                         _pointer, _pointer]
    return handle


@functools.lru_cache(maxsize=16)
def first_above(table: SoundTable) -> np.ndarray:
    """For each value b of U's top 16 bits, the number of thresholds S_k below the bucket's lowest V,
    (b << 48) - 2**63: the count every V of the bucket starts from (int32, read-only)."""
    lowest = (np.arange(2**TOP_BITS, dtype=np.int64) - 2 ** (TOP_BITS - 1)) << (64 - TOP_BITS)
    first = np.searchsorted(table.thresholds, lowest, side="left").astype(np.int32)
    first.flags.writeable = False
    return first


def _column(values: torch.Tensor | int, count: int) -> np.ndarray:
    return np.ascontiguousarray(torch.as_tensor(values, dtype=torch.int64).expand(count).numpy())


@dataclass(frozen=True)
class PatchOrder:
    """A patch layout as the kernel reads it (built once per layout, not per batch): the sound counter of each
    pair of positions, and the per-position ``mean`` and ``std`` of the normalization."""

    pairs: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def of(cls, counters: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> PatchOrder:
        """From a :class:`~dmae_fast.patch_layout.PatchLayout`'s ``counters`` (flat pixel index // 4 of each group
        of four, [1, L, C*p*p/4]) and ``normalization``: pixels 4c, 4c+1 take sound counter 2c, 4c+2, 4c+3 2c+1."""
        groups = counters.reshape(-1).to(torch.int64)
        pairs = torch.stack((2 * groups, 2 * groups + 1), dim=1).reshape(-1)
        return cls(*(np.ascontiguousarray(t.reshape(-1).cpu().numpy()) for t in (pairs, mean.float(), std.float())))


def sound_rows(clean: torch.Tensor, slot: torch.Tensor, table: SoundTable, key: tuple[int, int],
               image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor, *,
               order: PatchOrder | None = None, threads: int | None = None) -> torch.Tensor:
    """The noisy inputs float32 (X + Z) / L [B, *shape] of B rows of the clean images [S, *shape] (by slot):
    :func:`dmae_fast.sound_noise.sound_rows`, or with a patch layout's ``order`` the normalized patch rows of
    :func:`dmae_fast.fast_noise.sound_patches`. On ``threads`` threads (default: torch's)."""
    library = load()
    if library is None:
        raise RuntimeError("the C sound-noise kernel could not be built (no C compiler)")
    shape, count = clean.shape[1:], len(slot)
    numel = int(np.prod(shape))
    if count and not 0 <= int(slot.min()) <= int(slot.max()) < len(clean):  # C would read outside ``clean``
        raise IndexError(f"slot indices must lie in [0, {len(clean)})")
    X = torch.round(clean.float() * table.grid).to(torch.int32).reshape(len(clean), numel).contiguous().numpy()
    out = np.empty((count, numel), dtype=np.float32)
    pointers = [None] * 3 if order is None else [a.ctypes.data for a in (order.pairs, order.mean, order.std)]
    columns = [_column(c, count) for c in (slot, image, phase, sample)]

    def draw(rows: slice) -> None:
        library.sound_noise_rows(out[rows], X, numel, *(c[rows] for c in columns), rows.stop - rows.start,
                                 pointers[0], int(key[0]), int(key[1]), table.thresholds, table.K, first_above(table),
                                 table.grid, *pointers[1:])

    parts = max(1, min(threads or torch.get_num_threads(), count))
    ends = [count * i // parts for i in range(parts + 1)]
    if parts == 1:
        draw(slice(0, count))
    else:
        list(_pool(os.getpid(), parts).map(draw, (slice(a, b) for a, b in zip(ends, ends[1:]))))
    return torch.from_numpy(out).view(count, *shape)


@functools.lru_cache(maxsize=None)
def _pool(pid: int, threads: int) -> ThreadPoolExecutor:
    """The threads that share a batch's rows, kept for the life of process ``pid`` (a forked child, whose copy
    of the parent's pool has no threads, makes its own)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="dmae-sound-noise")
