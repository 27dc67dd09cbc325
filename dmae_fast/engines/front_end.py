"""The front end of a token engine, stored beside it: ``<engine>.frontend.safetensors``.

A token engine (``dmae-export --input tokens``) runs the transformer body only; the exporter writes the front end's
weights (``FRONT_END_KEYS``) beside it, so that the fused front end can feed it ``SmoothingClassifier.tokens(x)``
without the checkpoint. Normalization and shapes come from the sidecar."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import CONTENT_KEY, check_tensors, tensors_sha256
from dmae_fast.engines.sidecar import EngineMeta
from dmae_fast.model.classifier import SmoothingClassifier

FRONT_END_KEYS = ("cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias")
SUFFIX = ".frontend.safetensors"
ENGINE_KEY = "dmae_fast_engine"  # metadata: the engine file this front end belongs to


def front_end_path(engine: Path) -> Path:
    """``model-tokens.pt2`` -> ``model-tokens.pt2.frontend.safetensors``."""
    return engine.with_name(engine.name + SUFFIX)


def write_front_end(model: SmoothingClassifier, engine: Path) -> Path:
    """Save ``model``'s front-end weights beside ``engine`` (fp32, CPU)."""
    state = model.state_dict()
    tensors = {key: state[key].detach().float().contiguous().cpu() for key in FRONT_END_KEYS}
    path = front_end_path(engine)
    safetensors.torch.save_file(tensors, str(path), metadata={ENGINE_KEY: engine.name,
                                                              CONTENT_KEY: tensors_sha256(tensors)})
    return path


def front_end_model(meta: EngineMeta, tensors: dict[str, torch.Tensor]) -> SmoothingClassifier:
    """A body-less classifier (no transformer blocks) holding the front end of ``meta.spec``:
    its ``preprocess``, ``patch_embed`` and ``tokens()`` are the engine's front end."""
    spec = meta.spec
    bodiless = dataclasses.replace(spec, encoder=dataclasses.replace(spec.encoder, depth=0))
    model = SmoothingClassifier(bodiless).eval()
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k in FRONT_END_KEYS}
    found = {k: tuple(v.shape) for k, v in tensors.items()}
    if found != expected:
        raise ValueError(f"front-end tensors {found} do not match the classifier's {expected}")
    model.load_state_dict(tensors, strict=False)
    return model


def load_front_end(engine: Path, meta: EngineMeta) -> SmoothingClassifier:
    """The front end stored beside a token engine; one-line UserError if missing or foreign."""
    path = front_end_path(engine)
    if not path.is_file():
        raise UserError(f"token engine {engine.name} has no front end {path.name} beside it "
                        "(written by dmae-export --input tokens; export again)")
    try:
        with safetensors.safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        owner = metadata.get(ENGINE_KEY)
        if owner != engine.name:
            raise ValueError(f"it belongs to {json.dumps(owner)}")
        check_tensors(path, tensors, metadata.get(CONTENT_KEY))
        return front_end_model(meta, tensors)
    except (OSError, ValueError, safetensors.SafetensorError) as error:
        raise UserError(f"front end {path} does not fit {engine.name}: {error}") from None
