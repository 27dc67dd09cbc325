"""Micro-benchmark of the GELU + per-row e4m3 quantization pass (issue 38): ms per call and GB/s.

Times, interleaved for ``--rounds`` rounds on M x K random bfloat16 rows (several input buffers in
turn, together larger than the L2, so that every call reads its input from memory):

- ``kernel``: ``dmae_fast.kernels.gelu_quantize.gelu_quantize_rows`` (this tree's kernel);
- ``old kernel``: the kernel as it was before issue 38 (copied below: one masked 4,096-wide block,
  4 rows per program, integer-emulated roundings, a division per element), for the A/B;
- ``torch compiled``: the reference ``quantize_rows(F.gelu(h))`` under ``torch.compile``.

Each variant's bytes are compared with the reference's (``same bytes``: fraction of identical e4m3
bytes on the first buffer; the old kernel divides, so it differs a little by design, and Inductor
keeps GELU in float32 inside its fusion, skipping the bf16 rounding: ~1-2% of bytes). GB/s counts
2 bytes read and 1 written per element (and the scales). On CUDA each time is the median of
``triton.testing.do_bench``; elsewhere (Triton's interpreter, ``--smoke``) a median of a few calls,
to check that the script runs, not to time anything. Prints a table and writes it as JSON to --out.

    python bench/experiments/2026-11-27-fp8-kernels/gelu_quantize_bench.py --out gelu_quantize.json
    python bench/experiments/2026-11-27-fp8-kernels/gelu_quantize_bench.py --smoke --out /tmp/gq.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dmae_fast.kernels.gelu_quantize import gelu_quantize_rows  # sets TRITON_INTERPRET=1 where CUDA is absent
from dmae_fast.model.fp8 import E4M3, E4M3_MAX, TINY, quantize_rows

# isort: split
import triton
import triton.language as tl

L2_BYTES = 64 << 20  # more than an H100's or H200's L2 (50 MiB)


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _round_to_bf16(x):
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _round_to_e4m3(x):
    bits = x.to(tl.uint32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF).to(tl.int32) - 127
    step = tl.maximum(exponent, -6) - 3
    magic = ((step + 150) << 23 | 0x400000).to(tl.float32, bitcast=True)
    size = (tl.abs(x) + magic) - magic
    return (size.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)


@triton.jit
def _old_kernel(h_ptr, q_ptr, scale_ptr, M, K: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                TINY: tl.constexpr, LIMIT: tl.constexpr):
    """The kernel before issue 38 (commit f547fa4), unchanged."""
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    col = tl.arange(0, BLOCK_K)
    ok = (row < M)[:, None] & (col < K)[None, :]
    offset = row.to(tl.int64)[:, None] * K + col[None, :]
    h = tl.load(h_ptr + offset, mask=ok, other=0.0).to(tl.float32)
    g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    g = _round_to_bf16(g)
    scale = tl.maximum(tl.reduce(tl.abs(g), 1, _larger), TINY) / LIMIT
    q = _round_to_e4m3(tl.minimum(tl.maximum(g / scale[:, None], -LIMIT), LIMIT))
    tl.store(q_ptr + offset, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(scale_ptr + row, scale, mask=row < M)


def old_kernel(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, width = h.shape
    q = torch.empty((rows, width), dtype=E4M3, device=h.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=h.device)
    _old_kernel[(triton.cdiv(rows, 4),)](h, q, scale, rows, K=width, BLOCK_K=triton.next_power_of_2(width), ROWS=4,
                                         TINY=TINY, LIMIT=E4M3_MAX, num_warps=8)
    return q, scale


def reference(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(F.gelu(h))


def milliseconds(fn, cuda: bool) -> float:
    """Median time of one call of ``fn`` in ms."""
    if cuda:
        return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=201_728, help="M (default: ViT-B/16 at batch 1024, 197 tokens)")
    parser.add_argument("--width", type=int, default=3072, help="K (default: ViT-B/16's MLP width)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for a CPU check in the interpreter)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (must not exist)")
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"{args.out} exists already; name a new file with --out")
    if args.smoke:
        args.rows, args.rounds = 6, 1
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    size = args.rows * args.width * 2
    buffers = [torch.randn(args.rows, args.width, device=device).to(torch.bfloat16)
               for _ in range(max(2, min(8, -(-4 * L2_BYTES // size))))]
    compiled = torch.compile(reference)
    variants = {"kernel": lambda h: gelu_quantize_rows(h, E4M3_MAX, TINY), "old kernel": old_kernel,
                "torch compiled": compiled}
    expected = reference(buffers[0])[0].view(torch.uint8)
    same = {name: (run(buffers[0])[0].view(torch.uint8) == expected).float().mean().item()
            for name, run in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            turn = iter(range(1 << 62))
            times[name].append(milliseconds(lambda run=run: run(buffers[next(turn) % len(buffers)]), cuda))
    moved = args.rows * args.width * 3 + args.rows * 4
    rows = [{"variant": name, "ms": statistics.median(t), "GB/s": moved / statistics.median(t) / 1e6,
             "same bytes": same[name], "rounds ms": t} for name, t in times.items()]
    print(f"{args.rows} x {args.width} bf16 rows on {torch.cuda.get_device_name() if cuda else 'CPU (interpreter)'}, "
          f"{len(buffers)} input buffers, median of {args.rounds} rounds")
    print(f"{'variant':<16}{'ms per call':>12}{'GB/s':>9}{'same bytes':>12}")
    for row in rows:
        print(f"{row['variant']:<16}{row['ms']:>12.3f}{row['GB/s']:>9.0f}{row['same bytes']:>12.6f}")
    record = {"rows": args.rows, "width": args.width, "device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "buffers": len(buffers), "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
