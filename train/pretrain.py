"""DMAE pre-training: noise (sigma) + masking (ratio), reconstruct the clean image, all patches.

Each sample's noise and mask are drawn from (seed, dataset index, epoch) (see
:mod:`dmae_fast.train.randomness`). The result, ``pretrain.pth``, is a training checkpoint
in MAE/DMAE's layout ``{'model': state dict, 'args': resolved config + mean/std}``: it loads wherever
the official files load (``--init`` of fine-tuning, linear probing, continued pre-training,
``dmae-certify``'s checkpoint readers).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dmae_fast.base.errors import UserError
from dmae_fast.base.integrity import CONTENT_KEY, tensors_sha256
from dmae_fast.model.checkpoints import load_strict, read_checkpoint
from dmae_fast.model.config import DecoderConfig
from dmae_fast.model.dmae import DMAEPretrain
from dmae_fast.train.config import PretrainConfig, from_json, to_json
from dmae_fast.train.datasets import TrainingData
from dmae_fast.train.loop import Task
from dmae_fast.train.optim import param_groups
from dmae_fast.train.randomness import Stream, gaussians, uniforms

RESULT = "pretrain.pth"


def build_pretrain_model(config: PretrainConfig, mean: tuple[float, ...], std: tuple[float, ...]) -> DMAEPretrain:
    decoder = DecoderConfig(config.decoder_dim, config.decoder_depth, config.decoder_heads)
    return DMAEPretrain(config.encoder_config, decoder, mean, std, config.norm_pix_loss)


def pretrain_loss(model: nn.Module, config: PretrainConfig, images: torch.Tensor, index: torch.Tensor,
                  epoch: int) -> torch.Tensor:
    """The DMAE loss of one batch, noise and masks drawn per sample from (seed, index, epoch)."""
    noise = gaussians(config.seed, Stream.PRETRAIN_NOISE, index, epoch, tuple(images.shape[1:]))
    scores = uniforms(config.seed, Stream.MASK, index, epoch, config.encoder_config.grid_size ** 2)
    return model(images, config.sigma, config.mask_ratio, noise=noise, scores=scores).loss


class PretrainTask(Task):
    def __init__(self, config: PretrainConfig, data: TrainingData) -> None:
        encoder = config.encoder_config
        if data.input_size != encoder.img_size:
            raise UserError(
                f"pre-training feeds the encoder directly: data.input_size ({data.input_size}) must equal "
                f"the {config.encoder!r} encoder's image size {encoder.img_size}"
            )
        self.config, self.normalization = config, {"mean": list(data.mean), "std": list(data.std)}
        self.model = build_pretrain_model(config, data.mean, data.std)
        if config.init:  # continued pre-training (the paper's CIFAR-10 recipe)
            raw = read_checkpoint(config.init)
            load_strict(self.model, raw.state, raw.path, f"the {config.encoder!r} DMAE pre-training model")

    def param_groups(self) -> list[dict]:
        return param_groups(self.model, self.config.optim.weight_decay)

    def loss(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, index: torch.Tensor,
             epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
        return pretrain_loss(model, self.config, images, index, epoch), {}

    def save(self, out: Path, tag: str, info: dict[str, Any]) -> Path:
        path = out / RESULT
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        torch.save({"model": state, "args": {**to_json(self.config), **self.normalization},
                    CONTENT_KEY: tensors_sha256(state)}, path)
        return path


def load_own_pretrain(path: str | Path) -> DMAEPretrain | None:
    """A ``pretrain.pth`` written by this module, rebuilt from its own config; None otherwise."""
    raw = read_checkpoint(path)
    args = dict(raw.args)
    if args.get("subcommand") != "pretrain":
        return None
    where = f"the configuration inside {raw.path}"
    mean, std = args.pop("mean", None), args.pop("std", None)
    config = from_json(args, where)
    channels = config.encoder_config.in_chans
    if not all(_numbers(values, channels) for values in (mean, std)) or min(std) <= 0:
        raise UserError(f"{where}: mean and std must be lists of {channels} finite numbers (std > 0)")
    model = build_pretrain_model(config, tuple(mean), tuple(std))
    load_strict(model, raw.state, raw.path, "the DMAE model its config describes")
    return model


def _numbers(values: Any, count: int) -> bool:
    return isinstance(values, (list, tuple)) and len(values) == count and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
