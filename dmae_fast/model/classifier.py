"""The base classifier that randomized smoothing wraps.

normalize -> (resize to the encoder's size) -> ViT encoder -> pool -> fc_norm -> head. It *is* a timm
``VisionTransformer`` (state dict in timm's layout), with the input normalization as its first operation so that
noise is added in [0, 1] pixel space; mean/std are non-persistent buffers (the checkpoint's metadata holds them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from dmae_fast.model.config import ClassifierSpec

if TYPE_CHECKING:
    from dmae_fast.kernels.frontend_reference import FrontEnd


class SmoothingClassifier(VisionTransformer):
    """Maps images in [0, 1] (``spec.input_shape``) to logits over ``spec.num_classes``."""

    def __init__(self, spec: ClassifierSpec, drop_path_rate: float = 0.0) -> None:
        """``drop_path_rate``: stochastic depth for fine-tuning (inactive in eval mode)."""
        enc = spec.encoder
        super().__init__(img_size=enc.img_size, patch_size=enc.patch_size, in_chans=enc.in_chans,
                         num_classes=spec.num_classes, global_pool=spec.pool, embed_dim=enc.embed_dim,
                         depth=enc.depth, num_heads=enc.num_heads, mlp_ratio=enc.mlp_ratio,
                         drop_path_rate=drop_path_rate)
        if spec.head == "bn_linear":  # MAE/DMAE linear probing
            self.head = nn.Sequential(nn.BatchNorm1d(enc.embed_dim, affine=False, eps=1e-6),
                                      nn.Linear(enc.embed_dim, spec.num_classes))
        self.spec = spec
        channels = (1, enc.in_chans, 1, 1)
        self.register_buffer("mean", torch.tensor(spec.mean).view(channels), persistent=False)
        self.register_buffer("std", torch.tensor(spec.std).view(channels), persistent=False)

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """[0, 1] pixels -> normalized encoder input (resized if the spec asks for it)."""
        x = (images - self.mean) / self.std
        size = self.spec.encoder.img_size
        if self.spec.input_size != size:
            x = F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False)
        return x

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """[0, 1] pixels -> the encoder's input tokens [B, 1 + L, D] (class token, position added): the part a
        fused front end replaces. ``forward(x) == forward_tokens(tokens(x))``."""
        return self._pos_embed(self.patch_embed(self.preprocess(images)))

    def fused_front_end(self, sigma: float) -> FrontEnd:
        """This classifier's front end folded for ``sigma`` (float32), what the fused kernel computes with
        (:mod:`dmae_fast.kernels.frontend_reference`): W' = W * sigma / std_c, the class token plus
        position 0, the patches' positions. ValueError where no fused front end can serve it."""
        from dmae_fast.kernels.frontend_reference import FrontEnd

        reason = self.spec.fused_unsupported_reason
        if reason is not None:
            raise ValueError(f"no fused front end: {reason}")
        weight = self.patch_embed.proj.weight.detach().float()  # [D, C, p, p]
        scale = sigma / self.std.detach().float().view(1, -1, 1, 1)
        folded = (weight * scale).flatten(1).t().contiguous()
        pos = self.pos_embed.detach().float()[0]
        return FrontEnd(folded, self.cls_token.detach().float()[0, 0] + pos[0], pos[1:].contiguous(),
                        self.spec.encoder.patch_size, self.spec.input_shape)

    @torch.no_grad()
    def clean_embedding(self, images: torch.Tensor) -> torch.Tensor:
        """E = PatchEmbed(normalize(x)) [N, L, D] in float32: what the fused front end computes once per image."""
        return self.patch_embed(self.preprocess(images.float())).float()

    def forward_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The body after the front end: tokens [B, 1 + L, D] -> logits [B, num_classes]."""
        return self.forward_head(self.norm(self.blocks(self.norm_pre(tokens))))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return super().forward(self.preprocess(images))
