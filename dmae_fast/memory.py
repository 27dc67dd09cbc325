"""The process's allocator: keep freed host memory instead of handing large blocks back to the OS.

glibc's malloc serves a request above a threshold (dynamic, at most 32 MiB) with a fresh
``mmap`` and unmaps it on ``free``. A CPU forward pass whose activations take megabytes then
page-faults all of its memory in again on every batch. On the 2-core development machine,
keeping freed memory made Cohen et al.'s loop 1.07-1.42x faster and our plain body 1.21-1.46x
(bench/results/2026-11-25-cpu-fast/allocator/); without it the cost depended on what the
process had allocated before, which made the reference loops' figures drift between runs.

:func:`keep_freed_memory` sets glibc's mmap and trim thresholds to 1 GiB (``mallopt``): freed
blocks below that stay in the process and are reused. It also makes every thread allocate from
the one main arena (``M_ARENA_MAX`` 1): glibc gives other threads arenas of 64 MiB heaps that are
unmapped once empty, whatever the thresholds, so a batch body on a thread of its own
page-faulted its activations in again on every batch (``dmae-serve``'s device thread: 12,317
minor faults per 1,000 demo samples, 27 with one arena; the ``--fast`` workers on 224x224
inputs: 1,500-4,100, 11-530 with one arena, at the same speed within the variation). CPU
certification bodies and ``dmae-bench cpu`` (for the reference loops as well as ours) apply it;
the price is that the process keeps its peak heap size until it exits. It must run before the
threads that allocate start (a thread keeps the arena it first got). Nothing is changed when the
allocator is not glibc's or when the user set ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_ARENA_MAX`` themselves.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

KEEP_BELOW = 1 << 30
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's <malloc.h>
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


def glibc() -> bool:
    """Whether this process allocates with glibc's malloc (Linux with glibc)."""
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
