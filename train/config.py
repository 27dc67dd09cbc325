"""Typed configurations of the training subcommands and the paper's recipes as presets.

Every run is described by one of :class:`PretrainConfig`, :class:`FinetuneConfig`,
:class:`LinprobeConfig` or :class:`VisualizeConfig`. ``dmae-train SUBCOMMAND --preset NAME
--set field=value`` starts from a preset (or the defaults) and overrides fields; nested
fields are addressed with dots (``--set data.holdout=0.1``, ``--set optim.blr=1e-3``). The
resolved configuration is written as ``config.json`` beside every checkpoint.

``optim.batch_size`` is the EFFECTIVE batch of one optimizer step (all processes, all
accumulation steps), so a recipe means the same thing on 1 or 64 GPUs; the per-process
micro-batch is ``batch_size / (world_size * accum_steps)``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from dmae_fast.base.errors import UserError
from dmae_fast.model.config import ENCODER_PRESETS, MAX_SIGMA, NORMALIZATIONS, EncoderConfig, sigma_problem


@dataclass(frozen=True)
class DataConfig:
    """Where the training images come from and how they are augmented.

    ``dataset``: ``demo`` (scikit-learn digits, 1,297 training images), a CIFAR-10
    python-batches directory, or an ImageFolder directory (ImageNet layout). Images are
    noised at ``input_size`` (default: 8 for the demo, 32 for CIFAR-10, 224 for folders);
    the classifier resizes to the encoder's size inside, after normalization.
    """

    dataset: str = "demo"
    input_size: int | None = None
    holdout: float = 0.0  # fraction of the training data held out for model selection
    limit: int | None = None  # use only the first N training images (quick runs, tests)
    crop_scale: tuple[float, float] | None = (0.2, 1.0)  # RandomResizedCrop (bicubic); None: off
    hflip: bool = True
    randaug: str | None = None  # timm RandAugment spec, e.g. "rand-m9-mstd0.5-inc1"
    normalization: str = "imagenet"  # imagenet | cifar10 | dataset (statistics of the training images)
    num_workers: int = 4
    pin_memory: bool = True


@dataclass(frozen=True)
class OptimConfig:
    """AdamW (or LARS for linear probing), cosine schedule with linear warm-up."""

    epochs: int = 100
    warmup_epochs: float = 5.0
    batch_size: int = 256  # effective batch per optimizer step (all processes)
    accum_steps: int = 1
    blr: float = 1e-3  # base learning rate: lr = blr * batch_size / 256
    lr: float | None = None  # absolute learning rate (overrides blr)
    min_lr: float = 0.0
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    optimizer: Literal["adamw", "lars"] = "adamw"
    clip_grad: float | None = None  # max gradient norm; None: no clipping
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # fp16 uses a gradient scaler

    @property
    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else self.blr * self.batch_size / 256


@dataclass(frozen=True)
class RunConfig:
    """What all training subcommands share."""

    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    encoder: str = "base"  # a name in ENCODER_PRESETS (model/config.py)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    eval_every: int = 1  # epochs between evaluations on the held-out split
    save_every: int = 1  # epochs between checkpoints (the last epoch is always saved)

    @property
    def encoder_config(self) -> EncoderConfig:
        return ENCODER_PRESETS[self.encoder]


@dataclass(frozen=True)
class PretrainConfig(RunConfig):
    """DMAE pre-training: Gaussian noise + masking, reconstruct the clean image (all patches)."""

    sigma: float = 0.25
    mask_ratio: float = 0.75
    norm_pix_loss: bool = False
    decoder_dim: int = 512
    decoder_depth: int = 8
    decoder_heads: int = 16
    init: str | None = None  # continue from a pre-trained file (official or ours)
    optim: OptimConfig = OptimConfig(
        epochs=400, warmup_epochs=40, batch_size=4096, blr=1.5e-4, betas=(0.9, 0.95)
    )


@dataclass(frozen=True)
class ConsistencyConfig:
    """Consistency regularization (Jeong & Shin 2020): m noisy copies, lambda * KL + eta * H."""

    copies: int = 2
    lam: float = 2.0
    eta: float = 0.5


@dataclass(frozen=True)
class FinetuneConfig(RunConfig):
    """Fine-tuning a pre-trained encoder into a base classifier under Gaussian noise."""

    init: str | None = None  # pre-trained checkpoint (official DMAE/MAE file or ours)
    sigma: float = 0.25
    sigma_range: tuple[float, float] | None = None  # sigma ~ U[lo, hi] per sample (overrides sigma)
    consistency: ConsistencyConfig | None = ConsistencyConfig()  # None: plain RS (CE under noise)
    pool: Literal["avg", "token"] = "avg"
    layer_decay: float | None = 0.65
    drop_path: float = 0.1
    label_smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    head_init_std: float = 2e-5
    eval_noise_samples: int = 16  # noisy copies per held-out image for majority-vote accuracy
    data: DataConfig = DataConfig(holdout=0.02)


@dataclass(frozen=True)
class LinprobeConfig(RunConfig):
    """Linear probing: frozen encoder, BatchNorm1d(affine=False) + linear head, under noise."""

    init: str | None = None
    sigma: float = 0.25
    pool: Literal["avg", "token"] = "avg"
    head_init_std: float = 0.01
    eval_noise_samples: int = 16
    data: DataConfig = DataConfig(holdout=0.02, hflip=True)
    optim: OptimConfig = OptimConfig(
        epochs=90, warmup_epochs=10, batch_size=16384, blr=0.1, weight_decay=0.0, optimizer="lars"
    )


@dataclass(frozen=True)
class VisualizeConfig:
    """The paper's figure: original / noisy / masked noisy / reconstruction rows."""

    checkpoint: str | None = None  # a pre-training file (ours: its config.json is read beside it)
    dataset: str = "demo"
    split: str = "test"
    input_size: int | None = None
    images: int = 6
    sigma: float = 0.25
    mask_ratio: float = 0.75
    num_heads: int | None = None  # for foreign files whose width is not a standard ViT's
    seed: int = 0


TrainingConfig = PretrainConfig | FinetuneConfig | LinprobeConfig  # what the training subcommands run

CONFIGS: dict[str, type] = {
    "pretrain": PretrainConfig,
    "finetune": FinetuneConfig,
    "linprobe": LinprobeConfig,
    "visualize": VisualizeConfig,
}

# --------------------------------------------------------------------------- presets

_IN1K = DataConfig(dataset="imagenet/train", input_size=224, holdout=0.01, num_workers=10)
_CIFAR = DataConfig(
    dataset="cifar10", input_size=32, crop_scale=None, hflip=True, normalization="cifar10", holdout=0.02
)
_DEMO = DataConfig(dataset="demo", crop_scale=(0.6, 1.0), hflip=False, normalization="dataset",
                   num_workers=0, pin_memory=False)


def _finetune(encoder: str, sigma: float, consistency: bool) -> FinetuneConfig:
    """The appendix recipe for ViT-B/L fine-tuning on ImageNet."""
    large = encoder == "large"
    return FinetuneConfig(
        encoder=encoder,
        sigma=sigma,
        consistency=ConsistencyConfig(2, 2.0, 0.1 if sigma >= 1.0 else 0.5) if consistency else None,
        layer_decay=0.75 if large else 0.65,
        drop_path=0.2 if large else 0.1,
        label_smoothing=0.1,
        mixup=0.8,
        cutmix=1.0,
        data=replace(_IN1K, crop_scale=(0.08, 1.0), randaug="rand-m9-mstd0.5-inc1"),
        optim=OptimConfig(epochs=50 if large else 100, warmup_epochs=5, batch_size=1024,
                          blr=1e-3 if large else 5e-4, betas=(0.9, 0.999), weight_decay=0.05,
                          precision="bf16"),
    )


def _cifar_finetune(sigma: float | None, consistency: bool) -> FinetuneConfig:
    """CIFAR-10: 32x32 noised, resized to 224 inside; batch 256, 50 epochs, flip only."""
    return replace(
        _finetune("base", sigma or 0.25, consistency),
        sigma_range=(0.0, 0.75) if sigma is None else None,
        mixup=0.0,
        cutmix=0.0,
        data=_CIFAR,
        optim=replace(_finetune("base", 0.25, True).optim, epochs=50, batch_size=256),
    )


PRESETS: dict[str, RunConfig | VisualizeConfig] = {
    "dmae-vitb-pretrain": PretrainConfig(
        encoder="base", sigma=0.25, mask_ratio=0.75, norm_pix_loss=True,
        data=replace(_IN1K, holdout=0.0),
        optim=OptimConfig(epochs=1100, warmup_epochs=40, batch_size=4096, blr=1.5e-4,
                          betas=(0.9, 0.95), weight_decay=0.05, precision="bf16"),
    ),
    "dmae-vitl-pretrain": PretrainConfig(
        encoder="large", sigma=0.25, mask_ratio=0.75, norm_pix_loss=True,
        data=replace(_IN1K, holdout=0.0),
        optim=OptimConfig(epochs=1600, warmup_epochs=40, batch_size=4096, blr=1.5e-4,
                          betas=(0.9, 0.95), weight_decay=0.05, precision="bf16"),
    ),
    "cifar10-continue": PretrainConfig(
        encoder="base", sigma=0.25, mask_ratio=0.75, norm_pix_loss=True,
        data=replace(_CIFAR, input_size=224, holdout=0.0, crop_scale=(0.2, 1.0)),
        optim=OptimConfig(epochs=50, warmup_epochs=5, batch_size=512, blr=5e-5,
                          betas=(0.9, 0.95), weight_decay=0.05, precision="bf16"),
    ),
    **{
        f"dmae-vit{size[0]}-finetune-{kind}-sigma{sigma}": _finetune(size, sigma, kind == "cr")
        for size in ("base", "large") for kind in ("cr", "rs") for sigma in (0.25, 0.5, 1.0)
    },
    **{f"cifar10-finetune-cr-sigma{s}": _cifar_finetune(s, True) for s in (0.25, 0.5, 1.0)},
    "cifar10-finetune-cr-sigma0-0.75": _cifar_finetune(None, True),
    "dmae-vitb-linprobe": LinprobeConfig(
        encoder="base", sigma=0.25,
        data=replace(_IN1K, crop_scale=(0.08, 1.0), hflip=True),
        optim=OptimConfig(epochs=90, warmup_epochs=10, batch_size=16384, blr=0.1,
                          weight_decay=0.0, optimizer="lars", precision="bf16"),
    ),
    # The demo model (scikit-learn digits; about 10 min on 2 CPU cores in all).
    "demo-pretrain": PretrainConfig(
        encoder="demo", sigma=0.25, mask_ratio=0.75, norm_pix_loss=False,
        decoder_dim=64, decoder_depth=2, decoder_heads=4, data=_DEMO,
        optim=OptimConfig(epochs=200, warmup_epochs=10, batch_size=128, blr=1.5e-3,
                          betas=(0.9, 0.95), weight_decay=0.05),
    ),
    "demo-finetune": FinetuneConfig(
        encoder="demo", sigma=0.25, consistency=ConsistencyConfig(2, 2.0, 0.5), layer_decay=0.75,
        drop_path=0.1, label_smoothing=0.1, mixup=0.0, cutmix=0.0,
        data=replace(_DEMO, holdout=0.15, crop_scale=(0.8, 1.0)),
        optim=OptimConfig(epochs=100, warmup_epochs=5, batch_size=64, blr=4e-3, weight_decay=0.05),
    ),
    "demo-linprobe": LinprobeConfig(
        encoder="demo", sigma=0.25, data=replace(_DEMO, holdout=0.15, crop_scale=(0.8, 1.0)),
        # AdamW, not LARS: LARS' trust ratio (0.001) needs the thousands of steps of ImageNet.
        optim=OptimConfig(epochs=60, warmup_epochs=5, batch_size=128, blr=2e-2, weight_decay=0.0),
    ),
    "demo-visualize": VisualizeConfig(dataset="demo", split="test", images=6),
}


def preset_kind(name: str) -> str:
    """The subcommand a preset belongs to."""
    config = PRESETS[name]
    return next(kind for kind, cls in CONFIGS.items() if type(config) is cls)


# --------------------------------------------------------------------------- overrides


def resolve(kind: str, preset: str | None, overrides: list[str]) -> Any:
    """The configuration of a run: a preset (or the defaults) with ``field=value`` overrides."""
    if preset is not None:
        if preset not in PRESETS:
            raise UserError(f"unknown preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
        if preset_kind(preset) != kind:
            raise UserError(f"preset {preset!r} is for 'dmae-train {preset_kind(preset)}', not {kind!r}")
        config = PRESETS[preset]
    else:
        config = CONFIGS[kind]()
    for item in overrides:
        name, sep, text = item.partition("=")
        if not sep:
            raise UserError(f"--set expects field=value, got {item!r}")
        config = _override(config, name.strip().split("."), text.strip(), name.strip())
    validate(config)
    return config


def _override(config: Any, path: list[str], text: str, full: str) -> Any:
    hints = typing.get_type_hints(type(config))
    names = {f.name for f in fields(config)}
    if path[0] not in names:
        raise UserError(f"unknown field {full!r}; fields here: {', '.join(sorted(names))}")
    if len(path) > 1:
        inner = getattr(config, path[0])
        if not dataclasses.is_dataclass(inner):
            kind = _dataclass_in(hints[path[0]])
            if kind is None:
                raise UserError(f"{'.'.join(path[:1])} has no sub-fields (in {full!r})")
            inner = kind()
        return replace(config, **{path[0]: _override(inner, path[1:], text, full)})
    return replace(config, **{path[0]: _parse(text, hints[path[0]], full)})


def _dataclass_in(hint: Any) -> type | None:
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    return next((t for t in options if dataclasses.is_dataclass(t)), None)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _parse(text: str, hint: Any, name: str) -> Any:
    """A value of type ``hint`` from the command line (JSON lists/numbers, plain words)."""
    if _is_union(hint):
        options = typing.get_args(hint)
        if type(None) in options and text.lower() in ("none", "null", ""):
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _parse(text, option, name)
            except UserError as error:
                errors.append(str(error))
        raise UserError(errors[0])
    origin = typing.get_origin(hint)
    try:
        if hint is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if hint in (int, float):
            return hint(text)
        if hint is str:
            return text
        if origin is Literal:
            if text not in typing.get_args(hint):
                raise ValueError(f"expected one of {', '.join(map(str, typing.get_args(hint)))}")
            return text
        if origin is tuple:
            return _parse_tuple(text, typing.get_args(hint), name)
    except (ValueError, TypeError, RecursionError) as error:  # json.JSONDecodeError is a ValueError
        raise UserError(f"bad value {_shown(repr(text))} for {name}: {_shown(error, 80)}") from None
    if dataclasses.is_dataclass(hint):
        if text.lower() == "default":
            return hint()
        raise UserError(f"{name} is a group of fields: set {name}.FIELD=VALUE (or {name}=default)")
    raise UserError(f"{name} cannot be set from the command line (type {hint})")


def _parse_tuple(text: str, kinds: tuple[type, ...], name: str) -> tuple:
    """``a,b`` or a JSON list ``[a, b]`` of numbers."""
    if text.startswith("["):
        values = json.loads(text)
        if not isinstance(values, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise ValueError("expected a list of numbers")
    else:
        values = [v for v in text.split(",") if v.strip()]
    if len(values) != len(kinds):
        raise ValueError(f"expected {len(kinds)} comma-separated values")
    return tuple(kind(v) for kind, v in zip(kinds, values))


@dataclass(frozen=True)
class Range:
    """An interval of numbers, written as the error messages show it."""

    lo: float
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def __str__(self) -> str:
        if self.hi == math.inf:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


AT_LEAST_1, NON_NEGATIVE, POSITIVE = Range(1), Range(0), Range(0, lo_open=True)
FRACTION = Range(0, 1, hi_open=True)  # [0, 1)
NOISE = Range(0, MAX_SIGMA)

#: The range of each numeric field, by dotted name, in whichever configuration has it. An
#: optional field set to None (off) is not checked; a tuple's every element is.
RANGES: dict[str, Range] = {
    "seed": NON_NEGATIVE, "eval_every": AT_LEAST_1, "save_every": AT_LEAST_1,
    "data.input_size": AT_LEAST_1, "data.holdout": FRACTION, "data.limit": Range(2),
    "data.crop_scale": Range(0, 1, lo_open=True), "data.num_workers": NON_NEGATIVE,
    "optim.epochs": AT_LEAST_1, "optim.warmup_epochs": NON_NEGATIVE, "optim.batch_size": AT_LEAST_1,
    "optim.accum_steps": AT_LEAST_1, "optim.blr": POSITIVE, "optim.lr": POSITIVE,
    "optim.min_lr": NON_NEGATIVE, "optim.weight_decay": NON_NEGATIVE, "optim.betas": FRACTION,
    "optim.clip_grad": POSITIVE,
    "sigma": NOISE, "sigma_range": NOISE, "mask_ratio": FRACTION,
    "decoder_dim": AT_LEAST_1, "decoder_depth": AT_LEAST_1, "decoder_heads": AT_LEAST_1,
    "consistency.copies": AT_LEAST_1, "consistency.lam": NON_NEGATIVE, "consistency.eta": NON_NEGATIVE,
    "layer_decay": Range(0, 1, lo_open=True), "drop_path": FRACTION, "label_smoothing": FRACTION,
    "mixup": NON_NEGATIVE, "cutmix": NON_NEGATIVE, "head_init_std": NON_NEGATIVE,
    "eval_noise_samples": AT_LEAST_1,
    "input_size": AT_LEAST_1, "images": AT_LEAST_1, "num_heads": AT_LEAST_1,
}
INT64 = 2**63  # torch, NumPy and the noise generator take 64-bit integers


def _leaves(config: Any, prefix: str = "") -> typing.Iterator[tuple[str, Any]]:
    """(dotted name, value) of every field that is not itself a configuration."""
    for f in fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, value


def _check_leaf(name: str, value: Any) -> None:
    """The rules for every field: finite floats, 64-bit ints, non-empty strings, its range."""
    for item in value if isinstance(value, tuple) else (value,):
        if isinstance(item, str):
            _check(item != "", f"{name} must not be empty")
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if isinstance(item, float):
            _check(math.isfinite(item), f"{name} must be finite, got {item}")
        else:
            _check(-INT64 <= item < INT64, f"{name} = {_shown(item)} does not fit in 64 bits")
        if name in RANGES:
            _check(item in RANGES[name], f"{name} must be {RANGES[name]}, got {item}")


def check_mask_ratio(mask_ratio: float, encoder: EncoderConfig) -> None:
    """At least one patch must stay visible to the encoder."""
    patches = encoder.grid_size**2
    _check(int(patches * (1 - mask_ratio)) >= 1,
           f"mask_ratio {mask_ratio} hides all {patches} patches of a {encoder.img_size}x{encoder.img_size} "
           f"image (patch size {encoder.patch_size}); at most {(patches - 1) / patches:g}")


def validate(config: Any) -> None:
    """One-line errors for values no run could use: each field's own rules, then those
    between fields."""
    for name, value in _leaves(config):
        _check_leaf(name, value)
    if isinstance(config, VisualizeConfig):
        return
    _check(config.encoder in ENCODER_PRESETS,
           f"unknown encoder {config.encoder!r}; known: {', '.join(ENCODER_PRESETS)}")
    data, optim = config.data, config.optim
    _check(data.normalization in (*NORMALIZATIONS, "dataset"),
           f"data.normalization must be one of {', '.join((*NORMALIZATIONS, 'dataset'))}")
    _ordered("data.crop_scale", data.crop_scale)
    _check(optim.warmup_epochs <= optim.epochs, "optim.warmup_epochs must not exceed optim.epochs")
    _check(optim.min_lr <= optim.peak_lr, f"optim.min_lr ({optim.min_lr}) must not exceed the peak learning "
                                          f"rate ({optim.peak_lr:g})")
    if isinstance(config, PretrainConfig):
        _check(config.decoder_dim % config.decoder_heads == 0, "decoder_dim must be divisible by decoder_heads")
        check_mask_ratio(config.mask_ratio, config.encoder_config)
    else:  # the classifier's noise level: what dmae-certify certifies at
        _check(sigma_problem(config.sigma) is None, f"{sigma_problem(config.sigma)} (the classifier's noise level)")
    if isinstance(config, FinetuneConfig):
        _ordered("sigma_range", config.sigma_range)


def _ordered(name: str, pair: tuple[float, float] | None) -> None:
    _check(pair is None or pair[0] <= pair[1], f"{name} must be lo,hi with lo <= hi, got {pair}")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


def _shown(value: Any, limit: int = 40) -> str:
    """A value for an error message, shortened if long."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def to_json(config: Any) -> dict[str, Any]:
    """The resolved configuration as plain JSON (with the subcommand's name)."""
    kind = next(k for k, cls in CONFIGS.items() if type(config) is cls)
    return {"subcommand": kind, **dataclasses.asdict(config)}


def from_json(data: Any, where: str = "config.json") -> Any:
    """Rebuild a configuration written by :func:`to_json` and validate it as a new run's;
    UserError naming ``where`` if it is not one (unknown subcommand, unknown or missing
    field, wrong type, bad value)."""
    kind = data.get("subcommand") if isinstance(data, dict) else None
    if not isinstance(kind, str) or kind not in CONFIGS:
        raise UserError(f"{where} is not a dmae-train configuration (no known 'subcommand')")
    config = _build(CONFIGS[kind], {k: v for k, v in data.items() if k != "subcommand"}, where, "")
    try:
        validate(config)
    except UserError as error:
        raise UserError(f"{where}: {error}") from None
    return config


def _build(cls: type, data: Any, where: str, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise UserError(f"{where}: {prefix.rstrip('.') or 'the configuration'} must be an object")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    unknown, missing = sorted(set(data) - set(names)), [n for n in names if n not in data]
    for problem, keys in (("unknown", unknown), ("missing", missing)):
        if keys:
            raise UserError(f"{where}: {problem} field(s) {', '.join(prefix + _shown(n) for n in keys)}")
    values = {}
    for name, value in data.items():
        kind = _dataclass_in(hints[name])
        if kind is not None and isinstance(value, dict):
            value = _build(kind, value, where, f"{prefix}{name}.")
        elif isinstance(value, list):
            value = tuple(value)
        if not _has_type(value, hints[name]):
            raise UserError(f"{where}: {prefix}{name} = {_shown(repr(value))} is not of type {_type_name(hints[name])}")
        values[name] = value
    return cls(**values)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a JSON-decoded value fits a field's type hint (ints are accepted as floats)."""
    if _is_union(hint):
        return any(_has_type(value, option) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin is tuple:
        kinds = typing.get_args(hint)
        return isinstance(value, tuple) and len(value) == len(kinds) and all(map(_has_type, value, kinds))
    if dataclasses.is_dataclass(hint):
        return isinstance(value, hint)
    return True
