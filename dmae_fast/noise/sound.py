"""The noise of ``--sound``: the rounded Gaussian on the input's grid, exactly, as torch ops.

The contract (docs/sound.md), which the Triton kernel and the C++ library follow bit for bit:

* the clean image is X / L with X integer in [0, L]; the noise Z is an integer with
  P(Z = k) = Phi((k + 1/2) / s) - Phi((k - 1/2) / s), s = L * sigma, cut at |Z| <= K
  (:mod:`dmae_fast.stats.rounded_gaussian` makes the thresholds S_k and bounds what they cost);
* element e of the flat [C, H, W] image uses Philox counter (e // 2, sample, image, phase) keyed as in
  :mod:`dmae_fast.noise.contract`: element 2j takes words (w0, w1), element 2j + 1 words (w2, w3) of counter j;
* V = ((w_hi - 2**31) << 32) + w_lo (the 64-bit uniform U = w_hi * 2**32 + w_lo, less 2**63) and
  Z = -K + #{k : S_k <= V};
* the classifier sees float32(X + Z) / float32(L): a function of the exact integer sum X + Z alone.

The reference looks Z up with ``torch.searchsorted``; the compiled noise with :func:`guide_lookup`, a guide table
over a float-like index of V (:func:`bucket`) that leaves at most one threshold to compare for every V."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from dmae_fast.noise.contract import _counters, check_seed, interleave, key_words, philox4x32
from dmae_fast.stats.rounded_gaussian import SoundTable


def signed_uniform(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """V = w_hi * 2**32 + w_lo - 2**63 in int64 (no overflow: the high word is centred first)."""
    return (high - 2**31) * 2**32 + low


GUIDE_BITS = range(6, 17)  # the mantissa bits of the guide's buckets tried, fewest first


def bucket(values: torch.Tensor, bits: int) -> torch.Tensor:
    """The guide bucket of each V (int64 in, int64 out), non-decreasing in V.

    The distance d of V from the nearer end of the int64 range (U below the middle, 2**64 - 1 - U above)
    indexes like a float with ``bits`` mantissa bits: d itself below 2**(bits + 1), else the shift s that
    leaves d >> s in [2**bits, 2**(bits + 1)) and those bits, as (s << bits) + (d >> s). Buckets are one
    value wide at the ends and a 2**-bits fraction of d wide elsewhere, so the thresholds, which crowd together
    in V in the tails, spread over the buckets there as thinly as in the middle. Integer shifts and selects
    only: exact, and vectorized by a compiler."""
    distance = (values ^ ~(values >> 63)) & (2**63 - 1)
    mantissa, shift = distance, torch.zeros_like(distance)
    for step in (32, 16, 8, 4, 2, 1):  # the largest shift that keeps bits + 1 bits, in binary
        take = (mantissa >> step) >= (1 << bits)
        mantissa = torch.where(take, mantissa >> step, mantissa)
        shift = torch.where(take, shift + step, shift)
    index = (shift << bits) + mantissa
    return torch.where(values < 0, index, 2 * _half(bits) - 1 - index)


def _half(bits: int) -> int:
    """The number of buckets of either half of the int64 range."""
    return (64 - bits) << bits


def guide_bits(buckets: int) -> int:
    """The mantissa bits of a guide of ``buckets`` rows."""
    return next(bits for bits in GUIDE_BITS if 2 * _half(bits) == buckets)


def bucket_ends(bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The lowest and the highest V of each bucket of :func:`bucket` (int64, by bucket)."""
    index = np.arange(_half(bits), dtype=np.int64)
    shift = np.maximum((index >> bits) - 1, 0)
    mantissa = index - (shift << bits)
    low = mantissa << shift
    high = ((mantissa + 1) << shift) - 1  # the top bucket's end wraps to 2**63 and back to 2**63 - 1
    bottom, top = np.int64(-(2**63)), np.int64(2**63 - 1)
    return np.concatenate([bottom + low, (top - high)[::-1]]), np.concatenate([bottom + high, (top - low)[::-1]])


@functools.lru_cache(maxsize=16)
def guide_table(table: SoundTable) -> np.ndarray:
    """The guide of a table's thresholds S (n = 2K of them): [buckets, 1 + m] int64, read-only.

    Row b holds ``start - K`` and S[start], ..., S[start + m - 1], where c(v) = #{k : S_k <= v},
    m = max over buckets of c(highest) - c(lowest) (with the fewest bits tried that make it 1, where any do) and
    start = min(c(lowest), n - m). Exact for every V in
    bucket b: S[i] <= lowest <= V for i < start (start <= c(lowest)), and S[i] > highest >= V for
    i >= start + m (start + m >= c(highest)); so c(V) = start + #{j < m : S[start + j] <= V}, which is
    :func:`guide_lookup`'s one row gather and m comparisons."""
    thresholds = table.thresholds
    for bits in GUIDE_BITS:
        lowest, highest = bucket_ends(bits)
        first = np.searchsorted(thresholds, lowest, side="right")
        spread = int((np.searchsorted(thresholds, highest, side="right") - first).max())
        if spread <= 1:
            break
    start = np.minimum(first, len(thresholds) - spread)
    guide = np.stack([start - table.K, *(thresholds[start + j] for j in range(spread))], axis=1)
    guide.flags.writeable = False
    return guide


def guide_lookup(guide: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Z = #{k : S_k <= V} - K of each V (int64) from :func:`guide_table`'s rows (on the device): the same
    integers as ``torch.searchsorted(S, V, right=True) - K``, with one bucket and one row per value."""
    row = bucket(values, guide_bits(guide.shape[0]))
    noise = guide[row, 0]
    for j in range(1, int(guide.shape[1])):
        noise = noise + (guide[row, j] <= values).to(torch.int64)
    return noise


def rounded_gaussian_rows(key: tuple[Any, Any], thresholds: torch.Tensor, K: int | torch.Tensor,
                          image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor,
                          numel: int, guide: torch.Tensor | None = None) -> torch.Tensor:
    """The integer noise [B, numel] (int64) of B (image, phase, sample) triples, for the Philox key words (ints or
    int64 tensors) and a table's ``thresholds`` (int64, on the device) and ``K``; with its ``guide``
    (:func:`guide_table`, on the device) looked up by :func:`guide_lookup` (for a compiler), in int32."""
    # Four words per counter, two per element: the counters of 2 * numel words.
    w0, w1, w2, w3 = philox4x32(_counters(image, phase, sample, 2 * numel), key)
    even, odd = signed_uniform(w0, w1), signed_uniform(w2, w3)
    if guide is not None:  # looked up before interleaving, in int32: no [B, numel] tensor of 64-bit values
        return interleave(*(guide_lookup(guide, v).to(torch.int32) for v in (even, odd)))[:, :numel]
    return torch.searchsorted(thresholds, interleave(even, odd)[:, :numel].contiguous(), right=True) - K


def rounded_gaussian_noise(seed: int, table: SoundTable, image: torch.Tensor, phase: torch.Tensor | int,
                           sample: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The integer noise [B, *shape] (int32) of B (image, phase, sample) triples, on ``sample``'s device."""
    check_seed(seed)
    thresholds = torch.tensor(table.thresholds, device=sample.device)
    rows = rounded_gaussian_rows(key_words(seed), thresholds, table.K, image, phase, sample, math.prod(shape))
    return rows.to(torch.int32).reshape(-1, *shape)


def sound_rows(clean: torch.Tensor, slot: torch.Tensor, grid: int | torch.Tensor, thresholds: torch.Tensor,
               K: int | torch.Tensor, key: torch.Tensor, image: torch.Tensor, phase: torch.Tensor,
               sample: torch.Tensor, guide: torch.Tensor | None = None) -> torch.Tensor:
    """``(X + Z) / L`` [B, *shape] (float32): the noisy inputs of B rows under ``--sound``. ``clean`` [S, *shape]
    holds the clean images (on the 1/``grid`` grid) by slot, X = round(clean * L); ``key`` [2] the Philox key words."""
    shape = clean.shape[1:]
    noise = rounded_gaussian_rows((key[0], key[1]), thresholds, K, image, phase, sample, math.prod(shape), guide)
    total = torch.round(clean[slot] * grid).to(torch.int64) + noise.view(-1, *shape)
    # a float32 tensor on the device, not a Python number: CUDA divides by a host scalar as a product with
    # its reciprocal, which rounds differently from the true division the contract (and C++) computes
    levels = torch.as_tensor(grid, dtype=torch.float32, device=total.device)
    return total.to(torch.float32) / levels
