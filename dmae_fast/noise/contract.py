"""The noise contract: Gaussian noise as a pure function of its coordinates.

Every noise value is determined by (seed, image index, phase, sample index, element index) and
nothing else, so results are the same whatever the batching, the number of devices or the restart points.

Generator: Philox4x32-10 (Salmon et al., SC'11), the counter-based generator also behind
``triton.language.philox``, CUDA's curand and JAX.

* key    = (seed mod 2**32, seed // 2**32)                 (a 64-bit seed)
* counter = (element // 4, sample index, image index, phase)  (four uint32 words; the phase
  is a :class:`dmae_fast.stats.plan.Phase`)
* the four output words (w0, w1, w2, w3) of one counter feed elements 4k .. 4k+3.

Uniforms: ``u = ((w >> 9) + 0.5) * 2**-23``, exact in float32, strictly inside (0, 1).
Gaussians (Box-Muller, float32): with r = sqrt(-2 ln u0) and t = 2 pi u1, element 4k gets
r cos t and element 4k+1 gets r sin t; elements 4k+2 and 4k+3 do the same with (u2, u3).

``element`` indexes the flattened [C, H, W] image (channel-major, row-major) at the
resolution where noise is added (the classifier's input size). A kernel can compute any
element on its own: one Philox call per group of four elements."""

from __future__ import annotations

import math
from typing import Any

import torch

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
ROUNDS = 10


def _mulhilo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of multiplier * x for x in [0, 2**32), in int64 arithmetic."""
    low_half = (x & 0xFFFF) * multiplier  # < 2**48
    high_half = (x >> 16) * multiplier  # < 2**48
    middle = ((high_half & 0xFFFF) << 16) + low_half
    return (high_half >> 16) + (middle >> 32), middle & MASK32


def key_words(seed: int) -> tuple[int, int]:
    """The Philox key (k0, k1) of a 64-bit seed."""
    return seed & MASK32, (seed >> 32) & MASK32


def philox4x32(counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
               seed: int | tuple[Any, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding uint32 values (broadcast together). ``seed``: the 64-bit seed, or its
    key words (k0, k1) as ints or int64 tensors (a compiled caller's: a new seed is new data, not a new program)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key_words(seed) if isinstance(seed, int) else seed
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & MASK32, (k1 + _W1) & MASK32
    return c0, c1, c2, c3


def _counters(image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor,
              numel: int) -> tuple[torch.Tensor, ...]:
    """Counter words [B, ceil(numel/4)] for B samples (image, phase, sample index each)."""
    device = sample.device
    blocks = torch.arange((numel + 3) // 4, device=device, dtype=torch.int64)[None, :]
    as_column = lambda v: torch.as_tensor(v, device=device, dtype=torch.int64).reshape(-1, 1)  # noqa: E731
    return blocks, as_column(sample), as_column(image), as_column(phase)


def check_seed(seed: int) -> None:
    """Seeds are 64-bit keys; indices must lie in [0, 2**32) (callers guarantee it)."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")


def uint32_stream(seed: int, image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor,
                  numel: int) -> torch.Tensor:
    """The raw Philox words [B, 4 * ceil(numel/4)] as int64 holding uint32 values."""
    check_seed(seed)
    return interleave(*philox4x32(_counters(image, phase, sample, numel), seed))


def interleave(*planes: torch.Tensor) -> torch.Tensor:
    """[B, n * len(planes)]: the planes' values of each position in turn."""
    return torch.stack(torch.broadcast_tensors(*planes), dim=-1).flatten(1)


def words_to_uniform(words: torch.Tensor) -> torch.Tensor:
    """uint32 words (in int64) -> float32 uniforms ((w >> 9) + 0.5) * 2**-23, exact."""
    return ((words >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def gaussian_rows(key: tuple[Any, Any], image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor,
                  numel: int) -> torch.Tensor:
    """Standard Gaussians [B, numel] (float32) of B (image, phase, sample) triples and the key words: Box-Muller on
    the word planes before they are interleaved (same values, in the layout :mod:`.compiled` fuses into one pass)."""
    return interleave(*box_muller(philox4x32(_counters(image, phase, sample, numel), key)))[:, :numel]


def box_muller(words: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The four Philox words of each counter -> the Gaussians of its elements 4k, 4k+1, 4k+2, 4k+3."""
    u0, u1, u2, u3 = (words_to_uniform(w) for w in words)
    r01, t01 = torch.sqrt(-2.0 * torch.log(u0)), (2.0 * math.pi) * u1
    r23, t23 = torch.sqrt(-2.0 * torch.log(u2)), (2.0 * math.pi) * u3
    return r01 * torch.cos(t01), r01 * torch.sin(t01), r23 * torch.cos(t23), r23 * torch.sin(t23)


def gaussian_noise(seed: int, image: torch.Tensor, phase: torch.Tensor | int, sample: torch.Tensor,
                   shape: tuple[int, ...]) -> torch.Tensor:
    """Standard Gaussian noise [B, *shape] (float32) of B (image, phase, sample) triples: ``image``, ``sample`` (and
    ``phase``, unless an int) are 1-D integer tensors of length B on the noise's device."""
    check_seed(seed)
    return gaussian_rows(key_words(seed), image, phase, sample, math.prod(shape)).reshape(-1, *shape)
