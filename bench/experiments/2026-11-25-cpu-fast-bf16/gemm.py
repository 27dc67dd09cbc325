"""fp32 vs bf16 GEMM rates on one thread (torch.matmul, oneDNN): the demo block's shapes and 1024^3; best of 3.

Record of the fifth 2026-11-25 session (issue 12); run from the repository root:
    python bench/experiments/2026-11-25-cpu-fast-bf16/gemm.py
    # output: bench/results/2026-11-25-cpu-fast/bf16/gemm.txt
"""
import time

import torch


def rate(a, b, reps=20):
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] * reps / (time.perf_counter() - start) / 1e9


def main() -> None:
    torch.set_num_threads(1)
    for m, k, n in ((1024, 1024, 1024), (2176, 64, 192), (2176, 64, 256), (2176, 256, 64)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        fp32 = max(rate(a, b) for _ in range(3))
        bf16 = max(rate(a.bfloat16(), b.bfloat16()) for _ in range(3))
        print(f"{m}x{k} @ {k}x{n}: fp32 {fp32:.0f} GFLOP/s, bf16 {bf16:.0f} GFLOP/s ({bf16 / fp32:.2f}x)")


if __name__ == "__main__":
    main()
