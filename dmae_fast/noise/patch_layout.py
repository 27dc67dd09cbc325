"""Patch-major classifier inputs: images cut into the rows their patch embedding multiplies (L patches of C*p*p
values each), which the CPU fast path feeds its exported classifier, normalized, instead of images: the compiled
noise writes them (:func:`dmae_fast.noise.compiled.noisy_patches`) and the graph starts with one matrix product
(:class:`dmae_fast.engines.graphs.PatchGraph`) in place of a normalization pass, a reorder and a convolution.

A patch's values are in the convolution weight's order (channel, row, column); with a patch side a multiple of 4,
the four pixels that share a Philox counter stay side by side. The noise values are the contract's, element for
element; only where they are stored differs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

GROUP = 4  # pixels per Philox counter


@dataclass(frozen=True)
class PatchLayout:
    """The patch-major input of a square ``channels`` x ``size`` x ``size`` image, ``patch``
    pixels a side (a multiple of 4), normalized with per-channel ``mean`` and ``std``."""

    channels: int
    size: int
    patch: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def of(cls, model) -> PatchLayout | None:
        """The layout of a :class:`~dmae_fast.model.classifier.SmoothingClassifier`, or None where its front end is
        more than normalization + a plain patch convolution with a side a multiple of 4 (a resize, a normalized
        embedding)."""
        spec, embed = model.spec, model.patch_embed
        encoder, proj = spec.encoder, getattr(embed, "proj", None)
        p = encoder.patch_size
        plain = (isinstance(proj, nn.Conv2d) and proj.kernel_size == (p, p) and proj.stride == (p, p)
                 and proj.padding == (0, 0) and proj.dilation == (1, 1) and proj.groups == 1
                 and isinstance(getattr(embed, "norm", None), nn.Identity) and getattr(embed, "flatten", False)
                 and not getattr(model, "dynamic_img_size", False))
        if not plain or spec.input_size != encoder.img_size or p % GROUP or encoder.img_size % p:
            return None
        return cls(encoder.in_chans, encoder.img_size, p, tuple(spec.mean), tuple(spec.std))

    @property
    def row_shape(self) -> tuple[int, int]:
        """One image's input: [L patches, C*p*p values]."""
        return (self.size // self.patch) ** 2, self.channels * self.patch**2

    def arrange(self, images: torch.Tensor) -> torch.Tensor:
        """Images [..., C, H, W] -> their values in this layout [..., L, C*p*p] (a copy)."""
        lead, grid, p = images.shape[:-3], self.size // self.patch, self.patch
        x = images.reshape(-1, self.channels, grid, p, grid, p)  # c, py, r, px, column
        return x.permute(0, 2, 4, 1, 3, 5).reshape(*lead, *self.row_shape)

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] -> the classifier's normalized input rows (the plain path's arithmetic)."""
        mean, std = self.normalization
        return (self.arrange(images) - mean) / std

    def arrange_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """The patch convolution's weight [D, C, p, p] -> the matrix [D, C*p*p] over this layout."""
        return weight.reshape(len(weight), -1)

    @cached_property
    def counters(self) -> torch.Tensor:
        """[1, L, C*p*p/4] int64: the Philox counter (flat pixel index // 4) of each group of four."""
        flat = torch.arange(self.channels * self.size**2).view(1, self.channels, self.size, self.size)
        return self.arrange(flat)[..., ::GROUP] // GROUP

    @cached_property
    def normalization(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-value mean and std [C*p*p] in this layout."""
        ones = torch.ones((self.channels, self.size, self.size))
        return tuple(self.arrange(ones * torch.tensor(v).view(-1, 1, 1))[0].contiguous()
                     for v in (self.mean, self.std))
