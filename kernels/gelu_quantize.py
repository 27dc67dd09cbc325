"""Triton: GELU and per-row e4m3 quantization in one pass (the input of an fp8 body's fc2).

An fp8 block computes ``fc2(GELU(fc1(x)))`` with fc2's input quantized per row (per token):
``g = GELU(h)`` rounded to bfloat16 as the unfused body stores it, ``scale = max|g| / 448``
(at least 1e-12 / 448), ``q = clamp(g / scale, -448, 448)`` cast to e4m3. Unfused, or fused by
Inductor (which splits the 3,072-wide rows into a looped reduction that reads each row twice
and evaluates GELU twice), this pass cost more than the fp8 matrix products saved on an H200.
Here one program reads each row once, keeps it in registers, and writes the e4m3 row and its
scale: one read of bf16 and one write of e4m3 per element.

``gelu_quantize_rows`` is a ``torch.library.triton_op``, so ``torch.compile`` and CUDA graphs
see an ordinary operator. Its reference is ``dmae_fast.model.fp8.gelu_quantize_rows`` off CUDA
(``quantize_rows(F.gelu(h))``, what CPUs run; tests compare the two in Triton's interpreter).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch.library import triton_op, wrap_triton  # noqa: E402

E4M3 = torch.float8_e4m3fn
ROWS = 4  # rows per program


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _round_to_bf16(x):
    """float32 ``x`` rounded half-to-even to bfloat16 precision, still in float32 (integer
    operations: the interpreter's own bf16 cast does not round to nearest)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _round_to_e4m3(x):
    """``x`` (float32, |x| <= 448) rounded half-to-even onto the e4m3 grid, still in float32, so
    that the cast to e4m3 is exact whatever rounding the cast itself uses (the interpreter's is
    not round-to-nearest-even): adding and subtracting 1.5 * 2**23 * step rounds to a multiple of
    the grid step (2**(e - 3) for exponent e >= -6; 2**-9 below, the subnormals); the sign is
    copied back so that a tiny negative value becomes -0 as torch's cast makes it."""
    bits = x.to(tl.uint32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF).to(tl.int32) - 127
    step = tl.maximum(exponent, -6) - 3
    magic = ((step + 150) << 23 | 0x400000).to(tl.float32, bitcast=True)
    size = (tl.abs(x) + magic) - magic
    return (size.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)  # x's sign, -0 too


@triton.jit
def _gelu_quantize_kernel(h_ptr, q_ptr, scale_ptr, M, K: tl.constexpr, BLOCK_K: tl.constexpr,
                          ROWS: tl.constexpr, TINY: tl.constexpr, LIMIT: tl.constexpr):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    col = tl.arange(0, BLOCK_K)
    ok = (row < M)[:, None] & (col < K)[None, :]
    offset = row.to(tl.int64)[:, None] * K + col[None, :]
    h = tl.load(h_ptr + offset, mask=ok, other=0.0).to(tl.float32)
    g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
    g = _round_to_bf16(g)  # the activation the unfused body stores
    scale = tl.maximum(tl.reduce(tl.abs(g), 1, _larger), TINY) / LIMIT  # tl.max: a jit function (see fused_frontend)
    q = _round_to_e4m3(tl.minimum(tl.maximum(g / scale[:, None], -LIMIT), LIMIT))
    tl.store(q_ptr + offset, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(scale_ptr + row, scale, mask=row < M)


@triton_op("dmae_fast::gelu_quantize_rows", mutates_args=())
def gelu_quantize_rows(h: torch.Tensor, limit: float, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 rows [M, K], float32 scales [M, 1]) of GELU(h), ``h`` contiguous bfloat16 [M, K]:
    scale = max(max|GELU(h)|, floor) / limit, rows = GELU(h) / scale clamped to +-limit."""
    if h.dtype != torch.bfloat16 or h.dim() != 2:
        raise ValueError(f"gelu_quantize_rows takes 2-d bfloat16 rows, got {h.dtype} {tuple(h.shape)}")
    rows, width = h.shape
    q = torch.empty((rows, width), dtype=E4M3, device=h.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=h.device)
    grid = (triton.cdiv(rows, ROWS),)
    wrap_triton(_gelu_quantize_kernel)[grid](h, q, scale, rows, K=width, BLOCK_K=triton.next_power_of_2(width),
                                             ROWS=ROWS, TINY=floor, LIMIT=limit, num_warps=8)
    return q, scale
