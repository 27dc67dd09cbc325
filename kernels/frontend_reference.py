"""The fused front end in plain torch: what the Triton kernel must compute.

For a row (slot, image index, phase, sample index) the ViT's input tokens are

    tokens = [cls + pos_0 ;  E[slot] + W' @ patches(eta) + pos_1..L]

where ``E[slot] = PatchEmbed(normalize(x))`` (bias included) is computed once per image,
``eta`` is the noise contract's Gaussian for the row, and ``W'`` is the patch embedding's
weight with ``sigma / std_c`` folded into each input channel c. This equals
``SmoothingClassifier.tokens(x + sigma * eta)`` because normalization and the patch
embedding are linear: normalize(x + s eta) = normalize(x) + (s / std) eta, and
PatchEmbed(a + b) = PatchEmbed(a) + W @ b (the bias counted once, in E).

It holds only when the noise is added at the encoder's resolution: a classifier that
resizes inside (CIFAR-10: 32 -> 224) is run unfused
(:attr:`dmae_fast.model.config.ClassifierSpec.fused_unsupported_reason`). A classifier folds its own front end
(:meth:`dmae_fast.model.classifier.SmoothingClassifier.fused_front_end`) and computes E
(:meth:`~dmae_fast.model.classifier.SmoothingClassifier.clean_embedding`); this module reads no model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dmae_fast.noise.contract import gaussian_noise


@dataclass(frozen=True)
class FrontEnd:
    """A classifier's front end folded for one sigma (all float32, on the model's device)."""

    weight: torch.Tensor  # W' [K = C * p * p, D]: patch weight * sigma / std_c, (c, ph, pw)-major rows
    cls_row: torch.Tensor  # [D]: class token + position 0
    pos: torch.Tensor  # [L, D]: position embeddings of the patches
    patch: int
    image_shape: tuple[int, int, int]  # (C, H, W) where the noise is added

    def cast(self, dtype: torch.dtype) -> FrontEnd:
        """The same front end with W' in ``dtype`` (the fused kernel's GEMM input type)."""
        return dataclasses.replace(self, weight=self.weight.to(dtype))

    @property
    def num_patches(self) -> int:
        return self.pos.shape[0]

    @property
    def embed_dim(self) -> int:
        return self.pos.shape[1]


def noise_patches(noise: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, L, C * p * p], patches row-major, each in (c, ph, pw) order."""
    b, c, h, w = noise.shape
    grid = noise.reshape(b, c, h // patch, patch, w // patch, patch)
    return grid.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def reference_tokens(front: FrontEnd, embeddings: torch.Tensor, slot: torch.Tensor, image: torch.Tensor,
                     phase: torch.Tensor, sample: torch.Tensor, seed: int) -> torch.Tensor:
    """Tokens [B, 1 + L, D] (float32) for B rows; ``embeddings`` are E per slot [S, L, D]."""
    eta = gaussian_noise(seed, image, phase, sample, front.image_shape)
    patches = noise_patches(eta, front.patch) @ front.weight + embeddings[slot] + front.pos
    cls = front.cls_row.expand(len(slot), 1, -1)
    return torch.cat((cls, patches), dim=1)
