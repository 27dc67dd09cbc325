"""Reading and writing checkpoints in every layout users bring, recognised from the keys (after
unwrapping ``{'model': ...}`` training files and DDP ``module.`` prefixes):

* DMAE/MAE pre-training (the official bare state dict, or a training checkpoint ``{'model',
  'optimizer', 'epoch', 'scaler', 'args'}``): mask_token, decoder_*, norm.*;
* fine-tuned classifiers in timm's layout: fc_norm.* + head.* (average pool) or norm.* + head.*
  (class-token pool); the linear probe's head.0 (BatchNorm1d, affine=False) + head.1 (Linear);
* the project's own format: one ``.safetensors`` file whose metadata holds the
  :class:`ClassifierSpec` as JSON under the key ``dmae_fast``.

Pickled files are only ever read with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from timm.layers import resample_abs_pos_embed

from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import CONTENT_KEY, check_tensors, tensors_sha256
from dmae_fast.base.messages import one_line
from dmae_fast.base.paths import check_readable_file
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.model.config import (
    HEADS_BY_WIDTH,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ClassifierSpec,
    DecoderConfig,
    EncoderConfig,
)
from dmae_fast.model.dmae import DMAEPretrain

METADATA_KEY = "dmae_fast"
StateDict = dict[str, torch.Tensor]


class Layout(Enum):
    PRETRAIN = "DMAE/MAE pre-training (encoder + decoder)"
    CLASSIFIER = "fine-tuned classifier"
    ENCODER = "encoder without a head"


@dataclass
class RawCheckpoint:
    """A checkpoint's tensors and whatever description came with them."""

    path: Path
    state: StateDict
    spec: ClassifierSpec | None  # only the project's own format carries one
    args: dict[str, Any]  # training arguments of MAE/DMAE training checkpoints

    @property
    def layout(self) -> Layout:
        if "mask_token" in self.state or any(k.startswith("decoder_") for k in self.state):
            return Layout.PRETRAIN
        if "head.weight" in self.state or "head.1.weight" in self.state:
            return Layout.CLASSIFIER
        return Layout.ENCODER


def read_checkpoint(path: str | Path) -> RawCheckpoint:
    """Read any supported file into tensors (+ metadata); one-line UserError otherwise."""
    path = Path(path)
    check_readable_file(path, "checkpoint")
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    with open(path, "rb") as handle:
        magic = handle.read(2)
    if not magic.startswith((b"PK", b"\x80")):  # torch.save's zip archive, or a legacy pickle (protocol byte)
        raise UserError(f"{path} is not a PyTorch checkpoint (neither a torch.save zip archive nor a pickle)"
                        + (": it is a safetensors file, name it .safetensors" if _is_safetensors(path) else ""))
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for foreign or unsafe files
        raise UserError(f"cannot read checkpoint {path} safely (weights only): {one_line(error, first=True)}") from None
    args: dict[str, Any] = {}
    content = None  # the tensors' hash the project's training files carry (dmae_fast.base.integrity)
    if isinstance(payload, dict) and isinstance(payload.get("model"), dict):
        content = payload.get(CONTENT_KEY)
        extra = payload.get("args")
        args = vars(extra) if isinstance(extra, argparse.Namespace) else dict(extra or {})
        payload = payload["model"]
    elif isinstance(payload, dict) and isinstance(payload.get("state_dict"), dict):
        payload = payload["state_dict"]
    if not isinstance(payload, dict) or not payload or not all(isinstance(v, torch.Tensor) for v in payload.values()):
        raise UserError(f"checkpoint {path} holds no state dict of tensors (unknown layout)")
    check_tensors(path, payload, None if content is None else str(content))
    state = {k.removeprefix("module."): v for k, v in payload.items()}
    _check_finite(path, state)
    return RawCheckpoint(path, state, None, args)


def _check_finite(path: Path, state: StateDict) -> None:
    """Refuse NaN or infinite weights: such a classifier's outputs certify nothing."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
        raise UserError(f"checkpoint {path} has NaN or infinite values in {shown}: refusing a non-finite model")


def _is_safetensors(path: Path) -> bool:
    try:
        with safetensors.safe_open(str(path), framework="pt"):
            return True
    except Exception:  # noqa: BLE001 (anything else is simply not safetensors)
        return False


def _read_safetensors(path: Path) -> RawCheckpoint:
    try:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as error:
        raise UserError(f"cannot read {path} as safetensors: {error}") from None
    check_tensors(path, state, metadata.get(CONTENT_KEY))
    _check_finite(path, state)
    spec = None
    if METADATA_KEY in metadata:
        try:
            spec = ClassifierSpec.from_json_dict(json.loads(metadata[METADATA_KEY]))
        except (ValueError, TypeError, KeyError) as error:
            raise UserError(f"{path}: invalid dmae_fast metadata ({error})") from None
    return RawCheckpoint(path, state, spec, {})


def _shape(raw: RawCheckpoint, key: str, ndim: int) -> tuple[int, ...]:
    if key not in raw.state:
        raise UserError(f"checkpoint {raw.path} has no '{key}': not a ViT checkpoint (unknown layout)")
    shape = tuple(raw.state[key].shape)
    if len(shape) != ndim:
        raise UserError(f"checkpoint {raw.path}: '{key}' has shape {list(shape)}, expected {ndim} dimensions")
    return shape


def _count_blocks(raw: RawCheckpoint, prefix: str) -> int:
    """Number of transformer blocks ``prefix.N.*`` in the state dict (at least one)."""
    numbers = [int(m.group(1)) for k in raw.state if (m := re.match(rf"{prefix}\.(\d+)\.", k))]
    if not numbers:
        raise UserError(f"checkpoint {raw.path} has no '{prefix}.N.*' tensors: not a ViT checkpoint (unknown layout)")
    return 1 + max(numbers)


def _heads_from_args(raw: RawCheckpoint) -> int | None:
    """MAE/DMAE training args name the model, e.g. 'mae_vit_large_patch16'."""
    match = re.search(r"vit_(tiny|small|base|large|huge)", str(raw.args.get("model", "")))
    return {"tiny": 3, "small": 6, "base": 12, "large": 16, "huge": 16}[match.group(1)] if match else None


def infer_encoder(raw: RawCheckpoint, num_heads: int | None = None) -> EncoderConfig:
    """The encoder's shape from the tensors: width, depth, patch and image size. The attention heads, not visible in
    the weights, come from the argument, the training args, or the standard ViT widths (head width 64)."""
    width, in_chans, patch, _ = _shape(raw, "patch_embed.proj.weight", 4)
    tokens = _shape(raw, "pos_embed", 3)[1]
    grid = math.isqrt(max(tokens - 1, 0))
    if grid < 1 or grid * grid != tokens - 1:
        raise UserError(f"checkpoint {raw.path}: pos_embed has {tokens} rows, not 1 + a square grid")
    depth = _count_blocks(raw, "blocks")
    heads = num_heads or _heads_from_args(raw) or HEADS_BY_WIDTH.get(width)
    if heads is None:
        raise UserError(f"checkpoint {raw.path}: cannot infer the number of attention heads for width {width}")
    hidden = _shape(raw, "blocks.0.mlp.fc1.weight", 2)[0]
    try:
        return EncoderConfig(width, depth, heads, patch, grid * patch, in_chans, hidden / width)
    except ValueError as error:
        raise UserError(f"checkpoint {raw.path}: {error}") from None


def classifier_spec(raw: RawCheckpoint, *, input_size: int | None = None, mean: tuple[float, ...] | None = None,
                    std: tuple[float, ...] | None = None, num_heads: int | None = None) -> ClassifierSpec:
    """The spec of a fine-tuned classifier: stored metadata, else inferred from the keys (ImageNet normalization,
    noise at the encoder's size). ``input_size``, ``mean`` and ``std`` override what the file says."""
    if raw.layout is Layout.PRETRAIN:
        raise UserError(f"{raw.path} is a {Layout.PRETRAIN.value} checkpoint without a classification head: "
                        "fine-tune it into a classifier first")
    if raw.layout is Layout.ENCODER:
        raise UserError(f"{raw.path} has no classification head (no head.* keys): not a classifier")
    spec = raw.spec
    if spec is None:
        encoder = infer_encoder(raw, num_heads)
        linear_probe = "head.1.weight" in raw.state
        head_weight = raw.state["head.1.weight" if linear_probe else "head.weight"]
        spec = ClassifierSpec(encoder=encoder, num_classes=head_weight.shape[0], input_size=encoder.img_size,
                              mean=IMAGENET_MEAN, std=IMAGENET_STD,
                              pool="avg" if "fc_norm.weight" in raw.state else "token",
                              head="bn_linear" if linear_probe else "linear", provenance={"source": str(raw.path)})
    overrides = {k: v for k, v in (("input_size", input_size), ("mean", mean), ("std", std)) if v is not None}
    try:
        return replace(spec, **overrides)
    except ValueError as error:
        raise UserError(f"classifier {raw.path}: {error}") from None


def _resample_pos_embed(state: StateDict, grid: int) -> StateDict:
    """Interpolate the absolute position embedding (class-token row first) to grid x grid."""
    table = state.get("pos_embed")
    if table is None or table.shape[1] == grid * grid + 1:
        return state
    resampled = resample_abs_pos_embed(table, new_size=[grid, grid], num_prefix_tokens=1, verbose=False)
    return {**state, "pos_embed": resampled}


def load_strict(module: torch.nn.Module, state: StateDict, path: Path, what: str) -> None:
    """load_state_dict(strict=True) with a one-line error naming the keys that do not fit."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)):
        if keys:
            shown = ", ".join(keys[:4]) + (f" (+{len(keys) - 4} more)" if len(keys) > 4 else "")
            problems.append(f"{label} keys: {shown}")
    if problems:
        raise UserError(f"checkpoint {path} does not fit {what}: " + "; ".join(problems))
    module.load_state_dict(state, strict=True)


def load_classifier(path: str | Path, *, input_size: int | None = None, mean: tuple[float, ...] | None = None,
                    std: tuple[float, ...] | None = None, num_heads: int | None = None,
                    img_size: int | None = None) -> SmoothingClassifier:
    """A fine-tuned classifier from any supported file, in eval mode on the CPU; ``img_size`` changes the
    encoder's resolution (position embeddings interpolated)."""
    raw = read_checkpoint(path)
    spec = classifier_spec(raw, input_size=input_size, mean=mean, std=std, num_heads=num_heads)
    state = raw.state
    if img_size and img_size != spec.encoder.img_size:
        try:
            spec = replace(spec, encoder=replace(spec.encoder, img_size=img_size))
        except ValueError as error:
            raise UserError(f"cannot use {raw.path} at image size {img_size}: {error}") from None
        state = _resample_pos_embed(state, spec.encoder.grid_size)
    model = SmoothingClassifier(spec)
    load_strict(model, state, raw.path, f"a {spec.pool}-pool ViT classifier of width {spec.encoder.embed_dim}")
    return model.eval()


def load_pretrain(path: str | Path, num_heads: int | None = None) -> DMAEPretrain:
    """A DMAE/MAE pre-training model (official bare state dict or training checkpoint)."""
    raw = read_checkpoint(path)
    if raw.layout is not Layout.PRETRAIN:
        raise UserError(f"{raw.path} is a {raw.layout.value} checkpoint, not a pre-training one")
    encoder = infer_encoder(raw, num_heads)
    decoder = DecoderConfig(_shape(raw, "decoder_embed.weight", 2)[0], _count_blocks(raw, "decoder_blocks"))
    # Every official recipe pre-trains with norm_pix_loss; a bare release file records nothing.
    model = DMAEPretrain(encoder, decoder, norm_pix_loss=bool(raw.args.get("norm_pix_loss", True)))
    load_strict(model, raw.state, raw.path, "a DMAE pre-training model")
    return model


def encoder_state(path: str | Path, grid_size: int | None = None) -> StateDict:
    """The encoder tensors of any checkpoint, ready to initialize a classifier for fine-tuning: cls_token,
    pos_embed (resampled to ``grid_size``), patch_embed.*, blocks.*."""
    raw = read_checkpoint(path)
    keep = ("cls_token", "pos_embed", "patch_embed.", "blocks.")
    state = {k: v for k, v in raw.state.items() if k.startswith(keep)}
    return _resample_pos_embed(state, grid_size) if grid_size else state


def save_classifier(model: SmoothingClassifier, path: str | Path) -> Path:
    """Write the project's format: safetensors weights + the spec as JSON metadata + the weights' hash."""
    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    metadata = {METADATA_KEY: json.dumps(model.spec.to_json_dict()), CONTENT_KEY: tensors_sha256(state)}
    safetensors.torch.save_file(state, str(path), metadata=metadata)
    return path
