"""The host allocator setting (dmae_fast.base.memory): freed blocks stay in the process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dmae_fast.base.memory import glibc

pytestmark = pytest.mark.skipif(not glibc(), reason="the setting is glibc's")

# Whether a 64 MiB malloc is served by mmap (glibc's mallinfo2: bytes in mmapped blocks) after
# keep_freed_memory(), in a fresh process; prints the returned description on the first line.
PROBE = r'''
import ctypes
from dmae_fast.base.memory import keep_freed_memory
print(keep_freed_memory())
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2().hblkhd
block = libc.malloc(64 << 20)
print("mmapped" if libc.mallinfo2().hblkhd >= before + (64 << 20) else "heap")
libc.free(block)
'''


def _probe(**environment: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | environment
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=900)
    if "mallinfo2" in done.stderr:
        pytest.skip("this glibc has no mallinfo2 to observe the allocator with")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_large_blocks_come_from_the_heap_once_set():
    description, where = _probe()
    assert "keeps freed blocks below 1 GiB" in description
    assert where == "heap"


def test_the_users_own_malloc_settings_are_left_alone():
    description, where = _probe(MALLOC_MMAP_THRESHOLD_="65536")
    assert description == "glibc malloc as set by MALLOC_MMAP_THRESHOLD_"
    assert where == "mmapped"  # the user's 64 KiB threshold still rules


# Page faults of a non-main thread that allocates, touches and frees 5 x 20 MiB three times, after
# keep_freed_memory(). glibc gives other threads their own arenas, made of heaps of at most 64 MiB
# that are unmapped once empty whatever the thresholds: without one arena for all threads, every
# round faults ~40 MiB in again (measured: 10,241 pages a round; the server's device thread hit this).
THREAD_PROBE = r'''
import ctypes, resource, threading
from dmae_fast.base.memory import keep_freed_memory
keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults_of_a_round():
    start = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    blocks = [libc.malloc(20 << 20) for _ in range(5)]
    for block in blocks:
        ctypes.memset(block, 1, 20 << 20)
    for block in blocks:
        libc.free(block)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - start
faults = []
thread = threading.Thread(target=lambda: faults.extend(faults_of_a_round() for _ in range(3)))
thread.start()
thread.join()
print(*faults)
'''


def test_other_threads_keep_their_freed_memory_too():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", THREAD_PROBE], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    first, *again = map(int, done.stdout.split())
    assert first > 1000  # the first round faults its 100 MiB in (else the probe measures nothing)
    assert max(again) < 20, again  # then reuses it (with transparent huge pages it would still be >= 20)
