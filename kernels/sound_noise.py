"""Triton: the sound noise of ``--sound``, bit for bit with :mod:`dmae_fast.noise.sound`.

The contract (in full: :mod:`dmae_fast.noise.sound`): clean images lie on the grid x = X / L. Element
e of the flat [C, H, W] image takes the Philox4x32-10 words of counter (e // 2, sample, image, phase)
under the seed's key, (w0, w1) for even e and (w2, w3) for odd e, as U = w_hi * 2**32 + w_lo. With the
2K shifted thresholds S_k = T_k - 2**63 (int64, ascending) the noise is Z = -K + #{k : S_k <= U - 2**63},
i.e. Z = k iff T_{k-1} <= U < T_k, and the classifier's input is float32 (X + Z) / L, X = round(c * L)
from the stored float32 clean image c.

Why this is bit-exact on every device: everything up to the sum X + Z is integer arithmetic (Philox's
32-bit words, one 64-bit compare per step of a fixed-length binary search over the thresholds), so no
libm, no fused multiply-add and no evaluation order can change it. The float steps are each one
correctly rounded IEEE operation: c * L, round half to even (adding and subtracting 1.5 * 2**23,
exact for |c * L| < 2**22, i.e. for images in [0, 1]), int -> float32 of a small integer (exact) and
the division by L (``tl.div_rn``; Triton's ``/`` is an approximate division on GPUs). The launch turns
off fp fusion, so that ``c * L + 1.5 * 2**23`` is never contracted into one fma.

uint64 vs int64: U is never formed as an unsigned 64-bit number (Triton's and torch's unsigned 64-bit
support is partial, and a sign mix-up would silently reorder the comparisons). Its signed twin
V = U - 2**63 is built in int64 from its bits: (w_hi xor 2**31), reinterpreted as int32, sign-extended
and shifted up 32 bits, or-ed with w_lo. As U -> V is monotone, S_k <= V iff T_k <= U.

The search is "binary lifting": STEPS = ceil(log2(2K + 1)) probes, step sizes 2**(STEPS-1) .. 1,
each probe one gather from the thresholds in global memory (about 40 KiB at sigma = 1 on the 1/255
grid: cache-resident); it counts the S_k <= V exactly whatever the data (ties included), with no
data-dependent branch.
"""

from __future__ import annotations

import math

import torch

from dmae_fast.kernels.fused_frontend import INTERPRETED, _philox  # first: it sets TRITON_INTERPRET without a GPU

# isort: split
import triton
import triton.language as tl

# Triton turns an integer argument equal to 1 into a constant; key words, K and the levels may be 1.
UNSPECIALIZED = ["key_lo", "key_hi", "K", "levels"]
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: (p + m) - m rounds p to the nearest integer, ties to even


@triton.jit(do_not_specialize=UNSPECIALIZED)
def _sound_kernel(out_ptr, clean_ptr, thresholds_ptr, slot_ptr, image_ptr, phase_ptr, sample_ptr,
                  key_lo, key_hi, K, levels, numel, STEPS: tl.constexpr, BLOCK: tl.constexpr,
                  NOISE_ONLY: tl.constexpr):
    """B rows x numel elements: Z (int64) if NOISE_ONLY, else float32 (X + Z) / levels.

    A program covers BLOCK element pairs (2j, 2j + 1) of one row: one Philox call per pair.
    """
    row = tl.program_id(0)
    pair = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    lane = tl.arange(0, 2)[None, :]
    element = 2 * pair[:, None] + lane  # [BLOCK, 2]
    ok = element < numel
    image = tl.load(image_ptr + row).to(tl.uint32)
    phase = tl.load(phase_ptr + row).to(tl.uint32)
    sample = tl.load(sample_ptr + row).to(tl.uint32)
    zero = tl.full((BLOCK,), 0, tl.uint32)
    w0, w1, w2, w3 = _philox(pair.to(tl.uint32), sample + zero, image + zero, phase + zero,
                             key_lo.to(tl.uint32) + zero, key_hi.to(tl.uint32) + zero)
    high = tl.where(lane == 0, w0[:, None], w2[:, None])
    low = tl.where(lane == 0, w1[:, None], w3[:, None])
    signed_high = (high ^ 0x80000000).to(tl.int32, bitcast=True).to(tl.int64)
    v = (signed_high << 32) | low.to(tl.int64)  # U - 2**63, in int64
    count = tl.full((BLOCK, 2), 0, tl.int32)
    for i in tl.static_range(STEPS):
        probe = count + ((1 << (STEPS - 1 - i)) - 1)
        inside = probe < 2 * K
        threshold = tl.load(thresholds_ptr + probe, mask=inside, other=0)
        count = tl.where(inside & (threshold <= v), count + (1 << (STEPS - 1 - i)), count)
    noise = count - K
    offset = row.to(tl.int64) * numel + element
    if NOISE_ONLY:
        tl.store(out_ptr + offset, noise.to(tl.int64), mask=ok)
    else:
        slot = tl.load(slot_ptr + row).to(tl.int64)
        clean = tl.load(clean_ptr + slot * numel + element, mask=ok, other=0.0)
        scaled = clean * levels.to(tl.float32)
        level = ((scaled + ROUND_MAGIC) - ROUND_MAGIC).to(tl.int32)
        tl.store(out_ptr + offset, tl.div_rn((level + noise).to(tl.float32), levels.to(tl.float32)), mask=ok)


def search_steps(K: int) -> int:
    """Probes of the binary search over 2K thresholds: ceil(log2(2K + 1)), in integers."""
    return (2 * K).bit_length()


def sound_launch(out: torch.Tensor, clean: torch.Tensor, slot: torch.Tensor, levels: int, thresholds: torch.Tensor,
                 K: int, key: tuple[int, int], image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor,
                 numel: int, noise_only: bool) -> tuple[tuple[int, int], list, dict]:
    """(programs, positional arguments, constexprs and launch options) of ``_sound_kernel`` writing ``out``
    (also what tests compile for Hopper on a machine without a GPU)."""
    if thresholds.shape != (2 * K,) or thresholds.dtype != torch.int64:
        raise ValueError(f"the thresholds must be 2K = {2 * K} int64 values, got {thresholds.dtype} "
                         f"{tuple(thresholds.shape)}")
    device, count = out.device, len(out)
    rows = [torch.as_tensor(c, device=device).to(torch.int64).expand(count).contiguous()
            for c in (slot, image, phase, sample)]
    block = 512 if INTERPRETED else 256
    args = [out, clean, thresholds.to(device).contiguous(), *rows, *(int(w) for w in key), K, int(levels), numel]
    options = dict(STEPS=search_steps(K), BLOCK=block, NOISE_ONLY=noise_only, enable_fp_fusion=False)
    return (count, triton.cdiv(numel, 2 * block)), args, options


def rounded_gaussian_rows(key: tuple[int, int], thresholds: torch.Tensor, K: int, image: torch.Tensor,
                          phase: torch.Tensor | int, sample: torch.Tensor, numel: int) -> torch.Tensor:
    """The noise integers Z [B, numel] (int64) of B (image, phase, sample) rows, as the kernel draws them.

    ``key`` holds the Philox key words (ints; a tensor is read to the host), ``thresholds`` a table's S_k
    (int64 [2K], on the device), as :func:`dmae_fast.noise.sound.rounded_gaussian_rows` takes them."""
    out = torch.empty((len(sample), numel), dtype=torch.int64, device=sample.device)
    # the clean images, slots and grid are not read: ``out`` and ``sample`` stand in for them
    programs, args, options = sound_launch(out, out, sample, 1, thresholds, K, key, image, phase, sample, numel, True)
    _sound_kernel[programs](*args, **options)
    return out


def sound_rows(clean: torch.Tensor, slot: torch.Tensor, grid: int, thresholds: torch.Tensor, K: int,
               key: tuple[int, int], image: torch.Tensor, phase: torch.Tensor | int,
               sample: torch.Tensor) -> torch.Tensor:
    """The noisy inputs float32 (X + Z) / grid [B, *shape] of B rows of the clean images [S, *shape] (by slot):
    :func:`dmae_fast.noise.sound.sound_rows` computed by the kernel."""
    clean = clean.float().contiguous()
    out = torch.empty((len(slot), *clean.shape[1:]), dtype=torch.float32, device=clean.device)
    programs, args, options = sound_launch(out, clean, slot, grid, thresholds, K, key, image, phase, sample,
                                           math.prod(clean.shape[1:]), False)
    _sound_kernel[programs](*args, **options)
    return out
