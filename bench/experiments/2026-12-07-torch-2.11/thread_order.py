"""Which orders of torch.compile calls across threads crash a torch (torch 2.11.0: a segmentation fault).

    python bench/experiments/2026-12-07-torch-2.11/thread_order.py   # every case, each in a fresh interpreter

Each case runs in its own child process (a crash ends the process); the table gives its exit status (-11: SIGSEGV).
Pure torch: no dmae_fast code runs in the cases.
"""

from __future__ import annotations

import subprocess
import sys

import torch

CASES = {
    "main, then main": "compile_here(f); compile_here(g)",
    "worker (ended), then main": "compile_in_thread(f); compile_here(g)",
    "worker (ended), then another worker": "compile_in_thread(f); compile_in_thread(g)",
    "worker (ended), then main, same function, new shape": "compile_in_thread(f); compile_here(f, 9)",
    "main, then worker (ended), then main": "compile_here(g); compile_in_thread(f); compile_here(g, 9)",
    "worker alive, then main": "alive = keep_alive(f); compile_here(g); alive.set()",
    "worker alive, then main, then worker ended, then main":
        "alive = keep_alive(f); compile_here(g); alive.set(); THREADS[-1].join(); compile_here(g, 9)",
    "eager-backend trace on main first, then worker (ended), then main":
        "prime(); compile_in_thread(f); compile_here(g)",
}

PRELUDE = """
import threading
import torch

THREADS = []
def f(x):
    return torch.sin(x) * 2 + 1
def g(x):
    return torch.cos(x) - 3
def compile_here(fn, n=8):
    torch.compile(fn, dynamic=False)(torch.randn(n))
def compile_in_thread(fn):
    thread = threading.Thread(target=compile_here, args=(fn,))
    thread.start()
    thread.join()
def keep_alive(fn):
    compiled, leave = threading.Event(), threading.Event()
    def work():
        compile_here(fn)
        compiled.set()
        leave.wait()
    THREADS.append(threading.Thread(target=work))
    THREADS[-1].start()
    compiled.wait()
    return leave
def prime():
    torch.compile(lambda x: x + 1, backend="eager", dynamic=False)(torch.zeros(1))
"""


def run_case(body: str) -> int:
    return subprocess.run([sys.executable, "-c", PRELUDE + body], capture_output=True, timeout=600).returncode


if __name__ == "__main__":
    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}")
    print("| case | exit status |\n| --- | --- |")
    for name, body in CASES.items():
        print(f"| {name} | {run_case(body)} |")
