"""The device's measured matmul peak: the yardstick of the MFU column."""

from __future__ import annotations

import time

import torch


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int | None = None, seconds: float = 1.0) -> float:
    """Best FLOP/s of a square ``size`` matmul (8192 on CUDA, 1024 on CPU), timed for ``seconds``.

    CUDA timings use CUDA events around batches of 10 matmuls; the best batch counts.
    """
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    flops = 2.0 * size**3
    torch.matmul(a, b)  # warm-up (library selection)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                torch.matmul(a, b)
            end.record()
            end.synchronize()
            best = max(best, 10 * flops / (start.elapsed_time(end) / 1000))
        else:
            begin = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, flops / (time.perf_counter() - begin))
    return best
