"""Triton: noise generation fused with the patch embedding (the certifier's front end).

One launch turns B rows (slot, image index, phase, sample index) into the ViT's input
tokens [B, 1 + L, D] without writing any noise to memory:

    tokens[b, 0]     = cls + pos_0
    tokens[b, 1 + l] = E[slot_b, l] + sum_k W'[k, :] * eta_b(element(l, k)) + pos_{1+l}

Why this is exact (linearity): the classifier computes PatchEmbed(normalize(x + s eta)).
Normalization is affine per channel, normalize(x + s eta) = normalize(x) + (s / std_c) eta,
and the patch embedding is linear plus a bias, so the tokens are PatchEmbed(normalize(x))
(= E, bias included, computed once per image) plus W' @ eta, with W' = W * s / std_c folded
once per run. The identity needs the noise at the encoder's resolution: classifiers that
resize inside (CIFAR-10 32 -> 224) are run unfused (see ``frontend_reference``).

The noise is the contract's (:mod:`dmae_fast.noise.contract`): for flat [C, H, W] element e of the
row's image, Philox4x32-10 (key = seed lo/hi; written out with ``tl.umulhi``, the same
function as ``tl.philox``) on counter (e // 4, sample, image, phase); Box-Muller on words
(w0, w1) for e % 4 in {0, 1} and (w2, w3) for {2, 3}, cosine for even e, sine for odd.
The kernel maps (patch l, k = (c, ph, pw)) to e = c H W + (gy p + ph) W + gx p + pw.
The uint32 words equal the torch reference bit for bit; on the GPU log/cos/sin/sqrt come
from libdevice (CUDA's accurate math, as torch uses), in the interpreter from NumPy
(measured: at most 2.4e-7 from torch's CPU Gaussians).

The GEMM runs in the output dtype (fp16/bf16 tensor cores; fp32 with IEEE products)
with fp32 accumulation; tokens are written in the output dtype. Each program covers
BLOCK_M (row, patch) pairs x BLOCK_N channels, so eta is regenerated once per channel
tile: once for 16-bit weights and D <= 1024 (one tile spans D), D / 256 times otherwise.

Each noise value's expensive parts are computed once. When patch rows start at multiples
of 4 (P and W multiples of 4, as in every ViT here), a counter's 4 elements are consecutive
in k, so a tile runs Philox once per counter on [BLOCK_M, BLOCK_K / 4], Box-Muller once per
pair (one log and sqrt; the even element takes the cosine, the odd one the sine) and
interleaves the results back to [BLOCK_M, BLOCK_K] (``_quad_gaussians``): the same float32
operations on the same words as the per-element code, which other layouts keep
(``QUADS`` off), so the tokens are bit-identical either way.

On a machine without CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``
is set, for this process, before they are defined when no GPU is visible): slow, for tests.
Only builtins are used (no ``tl.zeros``/``tl.philox``, which are themselves jit functions
and break the interpreter when triton was imported before the variable was set).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dmae_fast.kernels.frontend_reference import FrontEnd  # noqa: E402
from dmae_fast.noise.contract import MASK32, check_seed  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
if not INTERPRETED:
    from triton.language.extra import libdevice
TWO_PI = tl.constexpr(6.283185307179586)  # rounded to float32 in the kernel, as torch rounds 2 * math.pi
# Triton turns an integer argument equal to 1 into a constant; a key word may be 1 (seed 1, 2**32).
SEED_WORDS = ["seed_lo", "seed_hi"]
TORCH_TO_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


@triton.jit
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 tensors (written out with builtins so the interpreter runs it
    whatever the import order; equal to ``tl.philox``, cross-checked in tests/test_noise.py)."""
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _contract_words(seed_lo, seed_hi, element, sample, image, phase):
    """The four Philox words of each element's counter (element // 4, sample, image, phase)."""
    zero = element * 0
    k0 = zero + seed_lo.to(tl.uint32)
    k1 = zero + seed_hi.to(tl.uint32)
    return _philox(element // 4, sample, image, phase, k0, k1)


@triton.jit
def _uniform(word):
    """The contract's uniform in (0, 1) of uint32 words: their top 23 bits, centred."""
    return ((word >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23


@triton.jit
def _box_muller(a, b, PRECISE: tl.constexpr):
    """(radius, cos, sin) of word pairs (a, b): their Gaussians are radius * cos and radius * sin."""
    angle = TWO_PI * _uniform(b)
    if PRECISE:
        radius = libdevice.sqrt_rn(-2.0 * libdevice.log(_uniform(a)))
        cos, sin = libdevice.cos(angle), libdevice.sin(angle)
    else:
        radius = tl.sqrt(-2.0 * tl.log(_uniform(a)))
        cos, sin = tl.cos(angle), tl.sin(angle)
    return radius, cos, sin


@triton.jit
def _contract_gaussians(seed_lo, seed_hi, element, sample, image, phase, PRECISE: tl.constexpr):
    """(own uint32 word, standard Gaussian) of each flat element index (all uint32 tensors)."""
    w0, w1, w2, w3 = _contract_words(seed_lo, seed_hi, element, sample, image, phase)
    lane = element % 4
    first_pair = lane < 2
    a = tl.where(first_pair, w0, w2)
    b = tl.where(first_pair, w1, w3)
    own = tl.where(lane % 2 == 0, a, b)
    radius, cos, sin = _box_muller(a, b, PRECISE)
    return own, radius * tl.where(lane % 2 == 0, cos, sin)


@triton.jit
def _quad_gaussians(seed_lo, seed_hi, first, sample, image, phase, ROWS: tl.constexpr, QUADS: tl.constexpr,
                    PRECISE: tl.constexpr):
    """Gaussians [ROWS, 4 QUADS] of the elements first + 0..3 for ``first`` [ROWS, QUADS] (multiples
    of 4): the same numbers as ``_contract_gaussians``, with one Philox call per counter, one radius
    per pair and one cosine (even element) or sine (odd element) per element."""
    w0, w1, w2, w3 = _contract_words(seed_lo, seed_hi, first, sample, image, phase)
    radius, cos, sin = _box_muller(tl.join(w0, w2), tl.join(w1, w3), PRECISE)  # [ROWS, QUADS, pair]
    return tl.reshape(tl.join(radius * cos, radius * sin), (ROWS, 4 * QUADS))  # [.., pair, parity] = lane


@triton.jit(do_not_specialize=SEED_WORDS)
def _noise_kernel(words_ptr, noise_ptr, image_ptr, phase_ptr, sample_ptr, seed_lo, seed_hi, numel,
                  BLOCK: tl.constexpr, PRECISE: tl.constexpr):
    """Words and Gaussians [B, numel] of B rows: the contract as the fused kernel computes it."""
    row = tl.program_id(0)
    element = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = element < numel
    image = tl.load(image_ptr + row).to(tl.uint32)
    phase = tl.load(phase_ptr + row).to(tl.uint32)
    sample = tl.load(sample_ptr + row).to(tl.uint32)
    zero = tl.full((BLOCK,), 0, tl.uint32)
    own, eta = _contract_gaussians(seed_lo, seed_hi, element.to(tl.uint32), sample + zero, image + zero, phase + zero,
                                   PRECISE)
    offset = row.to(tl.int64) * numel + element
    tl.store(words_ptr + offset, own.to(tl.int64), mask=ok)
    tl.store(noise_ptr + offset, eta, mask=ok)


@triton.jit
def _offset_in_image(k, P: tl.constexpr, H: tl.constexpr, W: tl.constexpr):
    """Flat [C, H, W] offset of patch entry k = (c, ph, pw) from the patch's top-left pixel."""
    return (k // (P * P)) * (H * W) + ((k // P) % P) * W + k % P


@triton.jit(do_not_specialize=SEED_WORDS)
def _fused_tokens_kernel(out_ptr, emb_ptr, weight_ptr, cls_ptr, pos_ptr,
                         slot_ptr, image_ptr, phase_ptr, sample_ptr, seed_lo, seed_hi, M,
                         L: tl.constexpr, D: tl.constexpr, K: tl.constexpr, P: tl.constexpr,
                         H: tl.constexpr, W: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, QUADS: tl.constexpr, PRECISE: tl.constexpr,
                         DOT_PRECISION: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (row, patch) pairs
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # channels
    m_ok = m < M
    n_ok = n < D
    row = m // L
    patch = m % L
    slot = tl.load(slot_ptr + row, mask=m_ok, other=0).to(tl.int64)
    image = tl.load(image_ptr + row, mask=m_ok, other=0).to(tl.uint32)[:, None]
    phase = tl.load(phase_ptr + row, mask=m_ok, other=0).to(tl.uint32)[:, None]
    sample = tl.load(sample_ptr + row, mask=m_ok, other=0).to(tl.uint32)[:, None]
    corner = (patch // (W // P)) * (P * W) + (patch % (W // P)) * P  # element of the patch's top-left pixel
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        if QUADS:  # k0 + 4q .. k0 + 4q + 3: one counter's elements, consecutive in a patch row
            first = k0 + 4 * tl.arange(0, BLOCK_K // 4)
            element = (corner[:, None] + _offset_in_image(first, P, H, W)[None, :]).to(tl.uint32)
            zero = tl.full((BLOCK_M, BLOCK_K // 4), 0, tl.uint32)
            eta = _quad_gaussians(seed_lo, seed_hi, element, sample + zero, image + zero, phase + zero,
                                  BLOCK_M, BLOCK_K // 4, PRECISE)
        else:
            element = (corner[:, None] + _offset_in_image(k, P, H, W)[None, :]).to(tl.uint32)
            zero = tl.full((BLOCK_M, BLOCK_K), 0, tl.uint32)
            _, eta = _contract_gaussians(seed_lo, seed_hi, element, sample + zero, image + zero, phase + zero,
                                         PRECISE)
        eta = tl.where(m_ok[:, None] & k_ok[None, :], eta, 0.0)
        weight = tl.load(weight_ptr + k[:, None] * D + n[None, :], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc += tl.dot(eta.to(weight.dtype), weight, input_precision=DOT_PRECISION)
    both = m_ok[:, None] & n_ok[None, :]
    clean = tl.load(emb_ptr + (slot * L + patch)[:, None] * D + n[None, :], mask=both, other=0.0)
    pos = tl.load(pos_ptr + patch[:, None] * D + n[None, :], mask=both, other=0.0)
    tokens = acc + clean.to(tl.float32) + pos
    row_start = row.to(tl.int64) * (L + 1) * D
    out_ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + (row_start + (1 + patch) * D)[:, None] + n[None, :], tokens.to(out_ty), mask=both)
    cls = tl.load(cls_ptr + n, mask=n_ok, other=0.0)
    cls_tile = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32) + cls[None, :]
    tl.store(out_ptr + row_start[:, None] + n[None, :], cls_tile.to(out_ty), mask=both & (patch == 0)[:, None])


def _key(seed: int) -> tuple[int, int]:
    """The Philox key words (seed mod 2**32, seed // 2**32) of a 64-bit seed."""
    check_seed(seed)
    return seed & MASK32, seed >> 32


def _rows(*columns: torch.Tensor) -> list[torch.Tensor]:
    return [c.to(torch.int64).contiguous() for c in columns]


def contract_noise(seed: int, image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor,
                   numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(words int64 [B, numel], Gaussians float32 [B, numel]) computed by the kernels' noise code."""
    grid, args, options = noise_launch(seed, image, phase, sample, numel)
    _noise_kernel[grid](*args, **options)
    return args[0], args[1]


def noise_launch(seed: int, image: torch.Tensor, phase: torch.Tensor, sample: torch.Tensor,
                 numel: int) -> tuple[tuple[int, ...], list, dict]:
    """(grid, positional arguments, constexprs and launch options) of ``_noise_kernel``."""
    image, phase, sample = _rows(image, phase, sample)
    words = torch.empty((len(image), numel), dtype=torch.int64, device=image.device)
    noise = torch.empty((len(image), numel), dtype=torch.float32, device=image.device)
    block = 1024
    grid = (len(image), triton.cdiv(numel, block))
    return grid, [words, noise, image, phase, sample, *_key(seed), numel], dict(BLOCK=block, PRECISE=not INTERPRETED)


TILES = ("split", "wide", "per-element")  # GPU launch configurations (benchmarks compare them); the first is used


def _blocks(front: FrontEnd, tiles: str) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps): large tiles in the interpreter (cost is per program).

    On the GPU, "wide" covers all D <= 1024 channels in one tile for 16-bit weights, so each
    noise value is made once; BLOCK_M keeps the fp32 accumulator at BLOCK_M * BLOCK_N / 256
    threads <= 128 registers, and the padded channels (768 -> 1024) cost only tensor-core
    products. "split" (also for fp32 weights, whose products run on the FMA units, and wider D)
    tiles D by 256 and makes the noise again per channel tile; "per-element" is "split" with
    one Philox call and one Box-Muller per element (the kernel before the quads).
    """
    if tiles not in TILES:
        raise ValueError(f"unknown tiles {tiles}; known: {', '.join(TILES)}")
    d, k = front.embed_dim, front.weight.shape[0]
    n = max(16, triton.next_power_of_2(d))
    if INTERPRETED:
        return 128, n, max(16, triton.next_power_of_2(k)), 4
    if tiles == "wide" and n <= 1024 and front.weight.element_size() == 2:
        return min(64, 128 * 256 // n), n, 32, 8
    return 64, min(256, n), 32, 8


def fused_tokens(front: FrontEnd, embeddings: torch.Tensor, slot: torch.Tensor, image: torch.Tensor,
                 phase: torch.Tensor, sample: torch.Tensor, seed: int, dtype: torch.dtype = torch.float32,
                 out: torch.Tensor | None = None, *, tiles: str = TILES[0]) -> torch.Tensor:
    """Tokens [B, 1 + L, D] in ``dtype`` for B rows (see the module docstring).

    ``front.weight`` is the GEMM's input type (``front.cast(dtype)`` once per run: fp16/bf16
    for tensor cores, fp32 for IEEE products); ``embeddings`` are E [S, L, D]. ``tiles`` (one of
    ``TILES``) is for benchmarks.
    """
    grid, args, options = tokens_launch(front, embeddings, slot, image, phase, sample, seed, dtype, out, tiles=tiles)
    _fused_tokens_kernel[grid](*args, **options)
    return args[0]


def tokens_launch(front: FrontEnd, embeddings: torch.Tensor, slot: torch.Tensor, image: torch.Tensor,
                  phase: torch.Tensor, sample: torch.Tensor, seed: int, dtype: torch.dtype,
                  out: torch.Tensor | None = None, *, tiles: str = TILES[0]) -> tuple[tuple[int, ...], list, dict]:
    """(grid, positional arguments, constexprs and launch options) of ``_fused_tokens_kernel``
    for :func:`fused_tokens` (also what tests compile for Hopper on a machine without a GPU)."""
    slot, image, phase, sample = _rows(slot, image, phase, sample)
    if INTERPRETED and front.weight.dtype == torch.bfloat16:  # the interpreter mis-reads bf16 operands
        front = front.cast(torch.float32)
    c, h, w = front.image_shape
    length, dim = front.num_patches, front.embed_dim
    if out is None:
        out = torch.empty((len(slot), 1 + length, dim), dtype=dtype, device=slot.device)
    block_m, block_n, block_k, warps = _blocks(front, tiles)
    rows = len(slot) * length
    grid = (triton.cdiv(rows, block_m), triton.cdiv(dim, block_n))
    args = [out, embeddings.contiguous(), front.weight, front.cls_row, front.pos, slot, image, phase, sample,
            *_key(seed), rows]
    # a counter's 4 elements are consecutive in k when patch rows start at multiples of 4
    quads = tiles != "per-element" and front.patch % 4 == 0 and w % 4 == 0
    options = dict(L=length, D=dim, K=c * front.patch**2, P=front.patch, H=h, W=w,
                   BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, QUADS=quads, PRECISE=not INTERPRETED,
                   DOT_PRECISION="ieee" if front.weight.dtype == torch.float32 else "tf32", num_warps=warps)
    return grid, args, options
