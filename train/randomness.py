"""Per-sample randomness: a pure function of (seed, stream, sample index, draw).

Training noise, masks, per-sample sigmas and augmentation seeds come from the project's
counter-based generator (:mod:`dmae_fast.noise.contract`, Philox4x32-10) keyed by the run's seed,
with the dataset index of the sample as the image coordinate and the epoch (times the
number of copies) as the draw. A sample therefore gets the same randomness whichever
process, batch or restart handles it: a 2-process run equals a 1-process run on the
combined batch, and a resumed run equals the uninterrupted one.
"""

from __future__ import annotations

from enum import IntEnum

import torch

from dmae_fast.noise.contract import gaussian_noise, philox4x32, uint32_stream, words_to_uniform


class Stream(IntEnum):
    """The counter's phase word for each kind of training randomness (certification uses 0-2)."""

    PRETRAIN_NOISE = 16
    MASK = 17
    FINETUNE_NOISE = 18
    SIGMA = 19
    AUGMENT = 20
    EVAL_NOISE = 21


def gaussians(seed: int, stream: Stream, index: torch.Tensor, draw: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard Gaussians [B, *shape] for the samples ``index`` [B] (int64, on the device)."""
    return gaussian_noise(seed, index, int(stream), torch.full_like(index, draw), shape)


def uniforms(seed: int, stream: Stream, index: torch.Tensor, draw: int, count: int) -> torch.Tensor:
    """Uniforms in (0, 1), [B, count] float32, for the samples ``index`` [B]."""
    words = uint32_stream(seed, index, int(stream), torch.full_like(index, draw), count)
    return words_to_uniform(words)[:, :count]


def sample_seed(seed: int, index: int, draw: int) -> int:
    """A 63-bit seed for one sample's data augmentation (used with ``torch.manual_seed``)."""
    w0, w1, _, _ = philox4x32((0, draw, index, int(Stream.AUGMENT)), seed)  # plain ints: fast
    return w0 << 31 | w1 >> 1


def seed_global_rngs(seed: int) -> None:
    """Seed torch, NumPy and Python's RNGs (weight init, drop path, timm's mixup draws)."""
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
