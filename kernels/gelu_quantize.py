"""Triton: GELU and per-row e4m3 quantization in one pass (the input of an fp8 body's fc2).

An fp8 block computes ``fc2(GELU(fc1(x)))`` with fc2's input quantized per row (per token):
``g = GELU(h)`` rounded to bfloat16 as the unfused body stores it, ``scale = max(max|g|, floor) /
limit``, ``q = clamp(g * (1 / scale), -limit, limit)`` cast to e4m3 (one IEEE division per row, as
:func:`dmae_fast.model.fp8.quantize_rows` does it). One program reads one row once, keeps it in
registers, and writes the e4m3 row and its scale: one read of bf16 and one write of e4m3 per element.

Layout, for speed (the pass is ~3 bytes per element, so it is only memory-bound if each element
costs a few dozen instructions and the SM keeps enough rows in flight): the row is cut into
``CHUNKS`` power-of-two chunks that tile it (3,072 = 3 x 1,024, so no lane computes a dead element;
a width with no such tiling gets a masked tail), all loaded first, GELU'd and max-reduced, then
scaled and stored chunk by chunk; one row per program, with enough warps for ~8 elements per thread
per chunk (16-byte loads, ~24 live values per thread at 3,072: many rows in flight per SM).

On the GPU the roundings are the hardware's casts (``cvt.rn``: round to nearest even, e4m3
saturating) and the two per-row divisions IEEE (``div_rn``; Triton's ``/`` is approximate there).
In Triton's interpreter, whose casts do not round to nearest even, the same roundings are done in
integer operations (``_round_to_bf16``, ``_round_to_e4m3``) so that tests reproduce torch there; the
GPU tests check that both paths give the same bytes on the GPU.

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
MAX_CHUNK = 1024  # elements per chunk, unless the row needs more than MAX_CHUNKS of them
MAX_CHUNKS = 8


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
def _gelu_quantize_kernel(h_ptr, q_ptr, scale_ptr, K: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                          TINY: tl.constexpr, LIMIT: tl.constexpr, EMULATE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    h_row, q_row = h_ptr + row * K, q_ptr + row * K
    hs = ()
    for c in tl.static_range(CHUNKS):  # every load issued before any arithmetic waits on one
        hs = hs + (tl.load(h_row + c * BLOCK + col, mask=c * BLOCK + col < K, other=0.0),)
    gs = ()
    for c in tl.static_range(CHUNKS):
        h = hs[c].to(tl.float32)
        g = 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))
        if EMULATE:  # the activation the unfused body stores
            g = _round_to_bf16(g)
        else:
            g = g.to(tl.bfloat16).to(tl.float32)
        gs = gs + (g,)
    largest = tl.abs(gs[0])
    for c in tl.static_range(1, CHUNKS):
        largest = tl.maximum(largest, tl.abs(gs[c]))
    amax = tl.reduce(largest, 0, _larger)  # tl.max: a jit function (see fused_frontend)
    scale = tl.math.div_rn(tl.maximum(amax, TINY), LIMIT)
    inverse = tl.math.div_rn(1.0, scale)
    for c in tl.static_range(CHUNKS):
        q = tl.minimum(tl.maximum(gs[c] * inverse, -LIMIT), LIMIT)
        if EMULATE:
            q = _round_to_e4m3(q)  # then the cast is exact
        tl.store(q_row + c * BLOCK + col, q.to(q_ptr.dtype.element_ty), mask=c * BLOCK + col < K)
    tl.store(scale_ptr + row, scale)


INTERPRETED = not isinstance(_gelu_quantize_kernel, triton.runtime.JITFunction)  # Triton's interpreter runs it


def _chunks(width: int) -> tuple[int, int]:
    """(chunk, chunks) for a row of ``width``: power-of-two chunks that tile it where its power-of-two
    factor allows (at most MAX_CHUNK wide, unless more than MAX_CHUNKS of them would be needed)."""
    chunk = max(16, min(width & -width, MAX_CHUNK))
    while triton.cdiv(width, chunk) > MAX_CHUNKS:
        chunk *= 2
    return chunk, triton.cdiv(width, chunk)


def _launch(h: torch.Tensor, limit: float, floor: float, emulate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel on ``h``; ``emulate``: the integer roundings instead of the hardware's casts."""
    rows, width = h.shape
    q = torch.empty((rows, width), dtype=E4M3, device=h.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=h.device)
    chunk, chunks = _chunks(width)
    # wrap_triton lets torch.compile trace the launch; torch 2.11's refuses an interpreted kernel (no compile there)
    kernel = _gelu_quantize_kernel if INTERPRETED else wrap_triton(_gelu_quantize_kernel)
    kernel[(rows,)](h, q, scale, K=width, BLOCK=chunk, CHUNKS=chunks, TINY=floor, LIMIT=limit, EMULATE=emulate,
                    num_warps=max(1, min(8, chunk // 256)))
    return q, scale


@triton_op("dmae_fast::gelu_quantize_rows", mutates_args=())
def gelu_quantize_rows(h: torch.Tensor, limit: float, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 rows [M, K], float32 scales [M, 1]) of GELU(h), ``h`` contiguous bfloat16 [M, K]:
    scale = max(max|GELU(h)|, floor) / limit, rows = GELU(h) * (1 / scale) clamped to +-limit."""
    if h.dtype != torch.bfloat16 or h.dim() != 2:
        raise ValueError(f"gelu_quantize_rows takes 2-d bfloat16 rows, got {h.dtype} {tuple(h.shape)}")
    return _launch(h, limit, floor, emulate=INTERPRETED)
