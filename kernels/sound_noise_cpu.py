"""C on a CPU: the sound noise of ``--sound``, bit for bit with :mod:`dmae_fast.noise.sound` (its reference).

Inductor's code for the torch-op lookup costs about a Philox word a gather (bench/results/2026-11-27-sound),
so ``--sound`` ran at half the default noise's speed where the noise is the work. ``sound_noise_cpu.c``
draws the same integers in plain C: Philox in a loop the compiler vectorizes, then a lookup that is one
load and one comparison for almost every element (its header says why it is exact).

The source is compiled once per machine with the system's C compiler (``$CC``, else ``cc``) into the model
cache's folder (:func:`dmae_fast.base.files.cache_folder`; with ``DMAE_FAST_CACHE=off``, a temporary folder
each run), keyed by the source, the compiler, its flags and the CPU's features (``-march=native`` builds for
this CPU: a home shared by a cluster's nodes keeps one library per kind of CPU), and called through ctypes,
which releases the GIL. A build is made in a fresh temporary folder, loaded and checked against the reference
on a small batch (:func:`_reproduces`), then renamed into the cache beside its digest file (the SHA-256 of the
build key and of the library's bytes), itself written whole. A cached library is loaded only when it is a
regular file that matches its digest file; any other (missing, altered, truncated, a FIFO, without the
kernel's symbol, failing the check) is built again, once. :func:`load` returns None where no library works,
and :func:`load_failure` says why where a compiler was found: the caller then runs the compiled torch ops,
names them ("compiled sound noise") where it names the noise, and gives that reason in one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
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

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import cache_folder, read_regular_file
from dmae_fast.base.messages import one_line
from dmae_fast.noise.sound import sound_rows as reference_rows
from dmae_fast.stats.rounded_gaussian import SoundTable, sound_table

SOURCE = Path(__file__).with_name("sound_noise_cpu.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC")
TOP_BITS = 16  # the lookup's buckets: U's top 16 bits
MAX_LIBRARY_BYTES = 64 << 20  # the largest cached library read (the kernel's is tens of KiB)

_i64, _i32, _f32 = (np.ctypeslib.ndpointer(t, flags="C_CONTIGUOUS") for t in (np.int64, np.int32, np.float32))
_pointer = ctypes.c_void_p  # arguments that may be NULL


class _Unusable(Exception):
    """A library that cannot be built, loaded or trusted; the message says why, in one line."""


def _cpu_features() -> bytes:
    """What ``-march=native`` depends on: the CPU's model and feature flags (Linux), else the platform's name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode() + platform.machine().encode()
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))})).encode()


def _build_key(compiler: str) -> str:
    """The SHA-256 of what makes the library: the source, the compiler, its flags and the CPU's features."""
    parts = [SOURCE.read_bytes(), compiler.encode(), " ".join(FLAGS).encode(), _cpu_features()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def _digest_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")




@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the library, None), else (None, why it could not be built; None where there is no compiler)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None, None
    build = _build_key(compiler)
    try:
        folder = cache_folder()
    except RuntimeError:  # no home directory
        folder = None
    library = None if folder is None else folder / f"sound_noise_cpu-{build[:16]}.so"
    if library is not None:
        with contextlib.suppress(_Unusable):
            return _cached(library, build), None
    try:
        return _built(compiler, build, library), None
    except _Unusable as error:
        return None, str(error)


def load() -> ctypes.CDLL | None:
    """The checked library (built on first use, then cached on disk), or None where none works."""
    return _load()[0]


def load_failure() -> str | None:
    """Why :func:`load` has no library although a compiler exists, in one line (None: it has one, or no compiler)."""
    return _load()[1]


def _cached(library: Path, build: str) -> ctypes.CDLL:
    """The cached ``library``, loaded: a regular file whose digest file records ``build`` and its SHA-256."""
    try:
        recorded = json.loads(read_regular_file(_digest_path(library), 4096, "C-kernel digest file"))
        data = read_regular_file(library, MAX_LIBRARY_BYTES, "C-kernel library")  # a FIFO is never opened
    except (UserError, ValueError) as error:
        raise _Unusable(str(error)) from None
    if recorded != {"build": build, "library": hashlib.sha256(data).hexdigest()}:
        raise _Unusable(f"{library} does not match its digest file")
    return _opened(library)


def _built(compiler: str, build: str, library: Path | None) -> ctypes.CDLL:
    """The source compiled in a fresh temporary folder, loaded and checked, then moved to ``library`` (None: not
    cached) beside its digest file; where the cache cannot be written, this run uses it uncached."""
    with _scratch(None if library is None else library.parent) as scratch:
        built = Path(scratch) / "sound_noise_cpu.so"
        try:
            subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], check=True, capture_output=True,
                           timeout=120)
        except subprocess.CalledProcessError as error:
            lines = error.stderr.decode(errors="replace").strip().splitlines()
            said = f": {one_line(lines[0])}" if lines else ""
            raise _Unusable(f"{compiler} exited with status {error.returncode}{said}") from None
        except (OSError, subprocess.SubprocessError) as error:
            raise _Unusable(f"{compiler} failed: {one_line(error)}") from None
        handle = _opened(built)
        if library is not None:
            with contextlib.suppress(OSError):
                _publish(built, build, library)
    return handle


def _scratch(folder: Path | None) -> tempfile.TemporaryDirectory:
    """A fresh temporary folder in ``folder`` (so the build is renamed into place), else in the system's."""
    if folder is not None:
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            return tempfile.TemporaryDirectory(dir=folder, prefix=".build-")
    try:
        return tempfile.TemporaryDirectory(prefix="dmae-fast-")
    except OSError as error:
        raise _Unusable(f"no folder to build it in ({one_line(error)})") from None


def _publish(built: Path, build: str, library: Path) -> None:
    """Move ``built`` to ``library`` and write its digest file, each by a rename (no reader sees half of one)."""
    record = json.dumps({"build": build, "library": hashlib.sha256(built.read_bytes()).hexdigest()})
    handle, temporary = tempfile.mkstemp(dir=library.parent, suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(record + "\n")
        os.replace(temporary, _digest_path(library))
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    os.replace(built, library)


def _opened(path: Path) -> ctypes.CDLL:
    """The library at ``path``, loaded, with the kernel's signature set, once it reproduces the reference."""
    try:
        handle = ctypes.CDLL(str(path))
        function = handle.sound_noise_rows
    except (OSError, AttributeError) as error:  # not a library for this machine; no sound_noise_rows
        raise _Unusable(f"its library does not load: {one_line(error)}") from None
    function.restype = None
    function.argtypes = [_f32, _i32, ctypes.c_int64, _i64, _i64, _i64, _i64, ctypes.c_int64, _pointer,
                         ctypes.c_uint32, ctypes.c_uint32, _i64, ctypes.c_int64, _i32, ctypes.c_int32,
                         _pointer, _pointer]
    if not _reproduces(handle):
        raise _Unusable("its library does not reproduce the reference")
    return handle


def _reproduces(library: ctypes.CDLL) -> bool:
    """Does ``library`` draw the reference's inputs bit for bit on three rows of 1,130 elements (three blocks of
    pairs), as images and as normalized patch rows with the pairs in reverse order?"""
    table, key, numel = sound_table(1.0, 16), (0x9E3779B9, 0x7F4A7C15), 1130
    clean = torch.arange(2 * numel).remainder(17).float().div(16).view(2, numel)
    slot, image, phase, sample = (torch.tensor(v) for v in ([1, 0, 1], [0, 7, 2**32 - 1], [0, 1, 2], [5, 3, 0]))
    images = reference_rows(clean, slot, 16, torch.tensor(table.thresholds), table.K, torch.tensor(key), image,
                            phase, sample)
    # patch position 2j + l takes pair counter pairs[j], lane l: image element 2 * pairs[j] + l
    pairs = np.arange(numel // 2)[::-1].copy()
    where = torch.from_numpy(np.stack((2 * pairs, 2 * pairs + 1), axis=1).reshape(-1))
    mean, std = torch.linspace(0.1, 0.9, numel), torch.linspace(0.2, 0.4, numel)
    moved = torch.empty_like(clean)
    moved[:, where] = clean
    patches = (reference_rows(moved, slot, 16, torch.tensor(table.thresholds), table.K, torch.tensor(key), image,
                              phase, sample)[:, where] - mean) / std
    order = PatchOrder(pairs, mean.numpy(), std.numpy())
    return all(torch.equal(_drawn(library, clean, slot, table, key, image, phase, sample, o, 1).view(torch.int32),
                           want.view(torch.int32)) for o, want in ((None, images), (order, patches)))


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
        """From a :class:`~dmae_fast.noise.patch_layout.PatchLayout`'s ``counters`` (flat pixel index // 4 of each group
        of four, [1, L, C*p*p/4]) and ``normalization``: pixels 4c, 4c+1 take sound counter 2c, 4c+2, 4c+3 2c+1."""
        groups = counters.reshape(-1).to(torch.int64)
        pairs = torch.stack((2 * groups, 2 * groups + 1), dim=1).reshape(-1)
        return cls(*(np.ascontiguousarray(t.reshape(-1).cpu().numpy()) for t in (pairs, mean.float(), std.float())))


def sound_rows(clean: torch.Tensor, slot: torch.Tensor, table: SoundTable, key: tuple[int, int],
               image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor, *,
               order: PatchOrder | None = None, threads: int | None = None) -> torch.Tensor:
    """The noisy inputs float32 (X + Z) / L [B, *shape] of B rows of the clean images [S, *shape] (by slot):
    :func:`dmae_fast.noise.sound.sound_rows`, or with a patch layout's ``order`` the normalized patch rows of
    :func:`dmae_fast.noise.compiled.sound_patches`. On ``threads`` threads (default: torch's)."""
    library = load()
    if library is None:
        raise RuntimeError(f"the C sound-noise kernel could not be built ({load_failure() or 'no C compiler'})")
    return _drawn(library, clean, slot, table, key, image, phase, sample, order, threads)


def _drawn(library: ctypes.CDLL, clean: torch.Tensor, slot: torch.Tensor, table: SoundTable, key: tuple[int, int],
           image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor, order: PatchOrder | None,
           threads: int | None) -> torch.Tensor:
    """:func:`sound_rows` drawn by ``library``."""
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
