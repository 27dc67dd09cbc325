"""The host allocator setting (dmae_fast.memory): freed blocks stay in the process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dmae_fast.memory import glibc

pytestmark = pytest.mark.skipif(not glibc(), reason="the setting is glibc's")

# Whether a 64 MiB malloc is served by mmap (glibc's mallinfo2: bytes in mmapped blocks) after
# keep_freed_memory(), in a fresh process; prints the returned description on the first line.
PROBE = r'''
import ctypes
from dmae_fast.memory import keep_freed_memory
print(keep_freed_memory())
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
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
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
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
