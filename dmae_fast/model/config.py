"""Typed descriptions of the networks: encoder presets and the classifier's specification."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from dmae_fast.base.errors import UserError, raise_first

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2471, 0.2435, 0.2616)
NORMALIZATIONS = {"imagenet": (IMAGENET_MEAN, IMAGENET_STD), "cifar10": (CIFAR10_MEAN, CIFAR10_STD)}


# Noise levels are in [0, 1] pixel units: far above 1 the noise drowns any image (and radii stay far from overflow).
MAX_SIGMA = 100.0


def sigma_problem(sigma: object) -> str | None:
    """Why ``sigma`` cannot be a noise level (None when it can): a finite number in (0, MAX_SIGMA]."""
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)):
        return f"sigma must be a number, got {sigma!r}"
    if not (math.isfinite(sigma) and 0 < sigma <= MAX_SIGMA):
        return f"sigma must be a finite number in (0, {MAX_SIGMA:g}] ([0, 1] pixel units), got {sigma}"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_require = functools.partial(raise_first, error=ValueError)  # the specs' checks (callers name the file)


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
        sizes = ("embed_dim", "num_heads", "patch_size", "img_size", "in_chans")
        _require([(_is_int(getattr(self, name)) and getattr(self, name) >= 1,
                   f"encoder {name} must be a whole number >= 1, got {getattr(self, name)!r}") for name in sizes])
        _require([(_is_int(self.depth) and self.depth >= 0,  # 0: a token engine's body-less front end
                   f"encoder depth must be a whole number >= 0, got {self.depth!r}")])
        _require([(not isinstance(self.mlp_ratio, bool) and isinstance(self.mlp_ratio, (int, float))
                   and math.isfinite(self.mlp_ratio) and self.mlp_ratio > 0,
                   f"encoder mlp_ratio must be a finite number > 0, got {self.mlp_ratio!r}")])
        if self.img_size % self.patch_size:
            raise ValueError(f"image size {self.img_size} is not divisible by the patch size {self.patch_size}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"width {self.embed_dim} is not divisible by {self.num_heads} heads")

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size


ENCODER_PRESETS: dict[str, EncoderConfig] = {
    # the shipped demo: 8x8 digits, no resize
    "demo": EncoderConfig(embed_dim=64, depth=4, num_heads=4, patch_size=2, img_size=8),
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
    """Everything needed to rebuild and feed a base classifier. ``input_size``: the side of the images it receives,
    where noise is added and radii are measured (if not the encoder's, it resizes, bicubic, after normalizing)."""

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

    def __post_init__(self) -> None:
        channels = self.encoder.in_chans if isinstance(self.encoder, EncoderConfig) else None
        _require([
            (isinstance(self.encoder, EncoderConfig), f"encoder must be an EncoderConfig, got {self.encoder!r}"),
            (_is_int(self.num_classes) and self.num_classes >= 1,
             f"num_classes must be a whole number >= 1, got {self.num_classes!r}"),
            (_is_int(self.input_size) and self.input_size >= 1,
             f"input size must be a whole number >= 1, got {self.input_size!r}"),
            (self.pool in ("avg", "token"), f"pool must be 'avg' or 'token', got {self.pool!r}"),
            (self.head in ("linear", "bn_linear"), f"head must be 'linear' or 'bn_linear', got {self.head!r}"),
        ])
        normalization_ok = all(
            isinstance(values, tuple) and len(values) == channels
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
            for values in (self.mean, self.std)) and min(self.std) > 0
        _require([
            (normalization_ok, f"normalization needs {channels} finite means and {channels} finite stds > 0, "
                               f"got mean {self.mean}, std {self.std}"),
            (self.sigma is None or sigma_problem(self.sigma) is None, str(sigma_problem(self.sigma))),
            (self.class_names is None or (isinstance(self.class_names, tuple)
                                          and all(isinstance(n, str) for n in self.class_names)),
             f"class_names must be a list of strings, got {self.class_names!r}"),
        ])
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class_names for {self.num_classes} classes")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.encoder.in_chans, self.input_size, self.input_size)

    def to_json_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def fused_unsupported_reason(self) -> str | None:
        """Why the fused front end (noise added to the patch embedding) cannot serve this classifier, or
        None if it can: it holds only where noise is added at the encoder's own resolution."""
        if self.input_size != self.encoder.img_size:
            return (f"the classifier resizes its {self.input_size}x{self.input_size} input to "
                    f"{self.encoder.img_size}x{self.encoder.img_size} inside")
        return None

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ClassifierSpec:
        """Rebuild a spec from :meth:`to_json_dict`'s output; ValueError/TypeError/KeyError if malformed."""
        if not isinstance(data, dict) or not isinstance(data.get("encoder"), dict):
            raise ValueError("the classifier description must be an object with an 'encoder' object")
        data = dict(data)
        data["encoder"] = EncoderConfig(**data["encoder"])
        for key in ("mean", "std", "class_names"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)


def parse_normalization(text: str | None) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """--normalize: a preset name or 'm1,m2,m3:s1,s2,s3' -> (mean, std); None keeps the checkpoint's."""
    if text is None:
        return None, None
    if text in NORMALIZATIONS:
        return NORMALIZATIONS[text]
    try:
        mean, std = (tuple(float(v) for v in part.split(",")) for part in text.split(":"))
    except ValueError:
        raise UserError(f"--normalize must be imagenet, cifar10 or 'm1,m2,m3:s1,s2,s3', got {text!r}") from None
    return mean, std  # channel count and std > 0 are checked with the classifier's spec
