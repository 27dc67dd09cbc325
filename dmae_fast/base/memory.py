"""The process's allocator: keep freed host memory instead of handing large blocks back to the OS.

glibc's malloc serves large requests with a fresh ``mmap`` unmapped on ``free``, and gives other threads arenas
unmapped once empty: a CPU forward pass then page-faults its megabytes of activations in again on every batch
(bench/results/2026-11-25-cpu-fast/allocator/). :func:`keep_freed_memory` sets the mmap and trim thresholds to
1 GiB and ``M_ARENA_MAX`` to 1 (``mallopt``), so the process keeps its peak heap size until it exits. It must run
before the threads that allocate start (a thread keeps the arena it first got). Nothing changes when the allocator
is not glibc's or the user set ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_ARENA_MAX``."""

from __future__ import annotations

import ctypes
import functools
import os
import platform

KEEP_BELOW = 1 << 30
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's <malloc.h>
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


def glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@functools.cache
def keep_freed_memory() -> str:
    """Apply the setting once per process; returns what the allocator does, for run records."""
    if not glibc():
        return "the platform's allocator, unchanged"
    chosen = [name for name in USER_SETTINGS if name in os.environ]
    if chosen:
        return f"glibc malloc as set by {', '.join(chosen)}"
    libc = ctypes.CDLL(None)
    if libc.mallopt(M_MMAP_THRESHOLD, KEEP_BELOW) != 1 or libc.mallopt(M_TRIM_THRESHOLD, KEEP_BELOW) != 1 \
            or libc.mallopt(M_ARENA_MAX, 1) != 1:
        return "glibc malloc; mallopt refused part of the setting (thresholds 1 GiB, one arena)"
    return "glibc malloc keeps freed blocks below 1 GiB (mmap and trim thresholds, one arena)"
