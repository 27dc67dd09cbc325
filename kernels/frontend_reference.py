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
(:func:`fused_unsupported_reason`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from dmae_fast.model import ClassifierSpec, SmoothingClassifier
from dmae_fast.noise import gaussian_noise


def fused_unsupported_reason(spec: ClassifierSpec) -> str | None:
    """Why the fused front end cannot serve this classifier, or None if it can."""
    if spec.input_size != spec.encoder.img_size:
        return (f"the classifier resizes its {spec.input_size}x{spec.input_size} input to "
                f"{spec.encoder.img_size}x{spec.encoder.img_size} inside")
    return None


@dataclass(frozen=True)
class FrontEnd:
    """A classifier's front end folded for one sigma (all float32, on the model's device)."""

    weight: torch.Tensor  # W' [K = C * p * p, D]: patch weight * sigma / std_c, (c, ph, pw)-major rows
    cls_row: torch.Tensor  # [D]: class token + position 0
    pos: torch.Tensor  # [L, D]: position embeddings of the patches
    patch: int
    image_shape: tuple[int, int, int]  # (C, H, W) where the noise is added

    @classmethod
    def from_model(cls, model: SmoothingClassifier, sigma: float) -> FrontEnd:
        reason = fused_unsupported_reason(model.spec)
        if reason is not None:
            raise ValueError(f"no fused front end: {reason}")
        weight = model.patch_embed.proj.weight.detach().float()  # [D, C, p, p]
        scale = sigma / model.std.detach().float().view(1, -1, 1, 1)
        folded = (weight * scale).flatten(1).t().contiguous()
        pos = model.pos_embed.detach().float()[0]
        return cls(folded, model.cls_token.detach().float()[0, 0] + pos[0], pos[1:].contiguous(),
                   model.spec.encoder.patch_size, model.spec.input_shape)

    def cast(self, dtype: torch.dtype) -> FrontEnd:
        """The same front end with W' in ``dtype`` (the fused kernel's GEMM input type)."""
        return dataclasses.replace(self, weight=self.weight.to(dtype))

    @property
    def num_patches(self) -> int:
        return self.pos.shape[0]

    @property
    def embed_dim(self) -> int:
        return self.pos.shape[1]


@torch.no_grad()
def clean_embedding(model: SmoothingClassifier, images: torch.Tensor) -> torch.Tensor:
    """E = PatchEmbed(normalize(x)) [N, L, D] in float32: computed once per image."""
    return model.patch_embed(model.preprocess(images.float())).float()


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
