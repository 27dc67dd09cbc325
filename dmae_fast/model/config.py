"""Typed descriptions of the networks: encoder presets and the classifier's specification."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2471, 0.2435, 0.2616)
NORMALIZATIONS = {"imagenet": (IMAGENET_MEAN, IMAGENET_STD), "cifar10": (CIFAR10_MEAN, CIFAR10_STD)}


@dataclass(frozen=True)
class EncoderConfig:
    """A ViT encoder (timm's VisionTransformer layout; MLP ratio 4, LayerNorm eps 1e-6)."""

    embed_dim: int
    depth: int
    num_heads: int
    patch_size: int = 16
    img_size: int = 224
    in_chans: int = 3
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        if self.img_size % self.patch_size:
            raise ValueError(
                f"image size {self.img_size} is not divisible by the patch size {self.patch_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(f"width {self.embed_dim} is not divisible by {self.num_heads} heads")

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size


ENCODER_PRESETS: dict[str, EncoderConfig] = {
    "demo": EncoderConfig(embed_dim=64, depth=4, num_heads=4, patch_size=2, img_size=8),  # the shipped demo: 8x8 digits, no resize
    "tiny": EncoderConfig(embed_dim=192, depth=12, num_heads=3),
    "small": EncoderConfig(embed_dim=384, depth=12, num_heads=6),
    "base": EncoderConfig(embed_dim=768, depth=12, num_heads=12),
    "large": EncoderConfig(embed_dim=1024, depth=24, num_heads=16),
}
# Heads of the standard widths: attention heads are not visible in a state dict.
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


@dataclass(frozen=True)
class DecoderConfig:
    """DMAE's light decoder: 8 blocks, width 512, 16 heads (as MAE)."""

    embed_dim: int = 512
    depth: int = 8
    num_heads: int = 16


@dataclass(frozen=True)
class ClassifierSpec:
    """Everything needed to rebuild and feed a base classifier.

    ``input_size`` is the side of the images the classifier receives, the resolution at
    which noise is added and radii are measured; if it differs from the encoder's image
    size, the classifier resizes (bicubic, antialias off) after normalizing.
    """

    encoder: EncoderConfig
    num_classes: int
    input_size: int
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    pool: Literal["avg", "token"] = "avg"
    head: Literal["linear", "bn_linear"] = "linear"
    sigma: float | None = None
    class_names: tuple[str, ...] | None = None
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.encoder.in_chans, self.input_size, self.input_size)

    def to_json_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ClassifierSpec:
        data = dict(data)
        data["encoder"] = EncoderConfig(**data["encoder"])
        for key in ("mean", "std", "class_names"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)
