"""The modules that get exported: a classifier wrapped with a fixed input kind and precision.

Every graph takes float32 and returns float32 logits; an fp16/bf16 graph casts inside.

* :class:`ImageGraph`: images in [0, 1] -> normalization (fp32) -> resize to the encoder's
  size, if any (fp32) -> cast -> ViT -> logits.
* :class:`TokenGraph`: ``SmoothingClassifier.tokens(x)`` -> cast -> transformer body -> logits.

The bicubic resize (e.g. CIFAR-10's 32 -> 224) is written as two matrix products with
fixed interpolation matrices instead of a Resize operator. Bicubic interpolation is linear
in the image and separable, so this is the same map up to float rounding, and it needs
nothing beyond MatMul from a runtime (TensorRT's ONNX parser documents only nearest and
linear Resize modes).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from dmae_fast.model import SmoothingClassifier

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def bicubic_matrix(size_in: int, size_out: int) -> torch.Tensor:
    """[size_out, size_in] matrix R with R @ column == bicubic resize of the column
    (F.interpolate, align_corners=False, no antialias), built by resizing the unit vectors."""
    unit = torch.eye(size_in, dtype=torch.float64)[None, None]  # [1, 1, in (rows), in (unit vectors)]
    return F.interpolate(unit, size=(size_out, size_in), mode="bicubic", align_corners=False)[0, 0]


class _Graph(nn.Module):
    def __init__(self, model: SmoothingClassifier, precision: str) -> None:
        super().__init__()
        self.dtype = DTYPES[precision]
        self.vit = copy.deepcopy(model).eval().to(self.dtype)


class ImageGraph(_Graph):
    """images [B, C, H, W] float32 in [0, 1] -> logits [B, num_classes] float32."""

    def __init__(self, model: SmoothingClassifier, precision: str = "fp32") -> None:
        super().__init__(model, precision)
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
        return VisionTransformer.forward(self.vit, x.to(self.dtype)).float()


class TokenGraph(_Graph):
    """tokens [B, 1 + L, D] float32 (class token and position embedding included) -> logits."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.vit.forward_tokens(tokens.to(self.dtype)).float()


def build_graph(model: SmoothingClassifier, input_kind: str, precision: str) -> nn.Module:
    graph = ImageGraph(model, precision) if input_kind == "image" else TokenGraph(model, precision)
    return graph.eval()


def example_input(model: SmoothingClassifier, input_kind: str, batch: int, device: torch.device) -> torch.Tensor:
    """A float32 example of the graph's input (tracing needs one)."""
    images = torch.rand((batch, *model.spec.input_shape), generator=torch.Generator().manual_seed(0))
    if input_kind == "image":
        return images.to(device)
    with torch.no_grad():
        return model.to(device).tokens(images.to(device))
