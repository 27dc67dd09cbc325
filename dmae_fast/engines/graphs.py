"""The modules that get exported (by ``dmae-export`` to files, by the CPU fast path in memory): a
classifier wrapped with a fixed input kind and precision; each takes float32 and returns float32 logits.

The CPU fast path exports with ``pooled_tail``: the last block's fc2 applied once to the average of the patch
tokens' hidden activations instead of to every token before the average pool (both maps are affine, so the logits
agree up to float rounding). The bicubic resize is two matrix products with fixed interpolation matrices, needing
only MatMul (TensorRT's ONNX parser documents no cubic Resize)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.noise.patch_layout import PatchLayout

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
OPSET = 17  # LayerNormalization is an ONNX operator from opset 17; TensorRT 10 parses opsets 9-24


def bicubic_matrix(size_in: int, size_out: int) -> torch.Tensor:
    """[size_out, size_in] matrix R with R @ column == bicubic resize of the column
    (F.interpolate, align_corners=False, no antialias), built by resizing the unit vectors."""
    unit = torch.eye(size_in, dtype=torch.float64)[None, None]  # [1, 1, in (rows), in (unit vectors)]
    return F.interpolate(unit, size=(size_out, size_in), mode="bicubic", align_corners=False)[0, 0]


class _Graph(nn.Module):
    def __init__(self, model: SmoothingClassifier, precision: str, pooled_tail: bool = False) -> None:
        super().__init__()
        if pooled_tail and not pooled_tail_applies(model):
            raise ValueError("pooled_tail needs average pooling and a plain timm Block/Mlp last block")
        self.dtype = DTYPES[precision]
        self.vit = copy.deepcopy(model).eval().to(self.dtype)
        self.pooled_tail = pooled_tail


class ImageGraph(_Graph):
    """images [B, C, H, W] float32 in [0, 1] -> normalize, resize (fp32) -> cast -> ViT -> logits [B, num_classes]."""

    def __init__(self, model: SmoothingClassifier, precision: str = "fp32", pooled_tail: bool = False) -> None:
        super().__init__(model, precision, pooled_tail)
        spec = model.spec
        channels = (1, spec.encoder.in_chans, 1, 1)
        self.register_buffer("mean", torch.tensor(spec.mean, dtype=torch.float32).view(channels))
        self.register_buffer("std", torch.tensor(spec.std, dtype=torch.float32).view(channels))
        self.resize = spec.input_size != spec.encoder.img_size
        matrix = bicubic_matrix(spec.input_size, spec.encoder.img_size).float()
        self.register_buffer("rows", matrix if self.resize else torch.empty(0))
        self.register_buffer("cols", matrix.T.contiguous() if self.resize else torch.empty(0))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images - self.mean) / self.std
        if self.resize:
            x = self.rows @ x @ self.cols
        x = x.to(self.dtype)
        if self.pooled_tail:
            return forward_embedded(self.vit, self.vit.patch_embed(x), pooled_tail=True).float()
        return VisionTransformer.forward(self.vit, x).float()


class PatchGraph(_Graph):
    """Normalized patch rows [B, L, C*p*p] float32 in a :class:`~dmae_fast.noise.patch_layout.PatchLayout` -> logits
    (fp32): the CPU fast path's graph, whose front end is one matrix product with the arranged patch weight."""

    def __init__(self, model: SmoothingClassifier, layout: PatchLayout, pooled_tail: bool = False) -> None:
        super().__init__(model, "fp32", pooled_tail)
        proj = self.vit.patch_embed.proj
        self.register_buffer("weight", layout.arrange_weight(proj.weight.detach()).contiguous())
        self.register_buffer("bias", None if proj.bias is None else proj.bias.detach().clone())

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return forward_embedded(self.vit, F.linear(patches, self.weight, self.bias), self.pooled_tail)


def pooled_tail_applies(model: VisionTransformer) -> bool:
    """Whether :func:`forward_embedded` with ``pooled_tail`` computes ``model``'s forward: average pooling of the
    last block's output, and a last block of timm's plain kind."""
    last = model.blocks[-1]
    return (model.global_pool == "avg" and isinstance(model.norm, nn.Identity)
            and getattr(model, "attn_pool", None) is None and type(last) is Block and type(last.mlp) is Mlp)


def forward_embedded(vit: VisionTransformer, embedded: torch.Tensor, pooled_tail: bool) -> torch.Tensor:
    """timm's eval forward from the patch embedding's output [B, L, D]; with ``pooled_tail``, the
    last block's fc2 moved after the average pool (module doc)."""
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(embedded)))
    if not pooled_tail:
        return vit.forward_head(vit.norm(vit.blocks(x)))
    *body, last = vit.blocks
    for block in body:
        x = block(x)
    x = x + last.drop_path1(last.ls1(last.attn(last.norm1(x))))
    x = x[:, vit.num_prefix_tokens:]
    mlp = last.mlp
    hidden = mlp.norm(mlp.drop1(mlp.act(mlp.fc1(last.norm2(x)))))
    pooled = x.mean(1) + last.drop_path2(last.ls2(mlp.drop2(mlp.fc2(hidden.mean(1)))))
    return vit.head(vit.head_drop(vit.fc_norm(pooled)))


class TokenGraph(_Graph):
    """tokens [B, 1 + L, D] float32 (``SmoothingClassifier.tokens(x)``) -> cast -> transformer body -> logits."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.vit.forward_tokens(tokens.to(self.dtype)).float()


def build_graph(model: SmoothingClassifier, input_kind: str, precision: str) -> nn.Module:
    return (ImageGraph(model, precision) if input_kind == "image" else TokenGraph(model, precision)).eval()


def example_input(model: SmoothingClassifier, input_kind: str, batch: int, device: torch.device) -> torch.Tensor:
    """A float32 example of the graph's input (tracing needs one)."""
    images = torch.rand((batch, *model.spec.input_shape), generator=torch.Generator().manual_seed(0))
    if input_kind == "image":
        return images.to(device)
    with torch.no_grad():
        return model.to(device).tokens(images.to(device))
