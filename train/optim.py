"""Optimizers: parameter groups (no decay on norms, biases, tokens), layer-wise lr decay,
LARS for linear probing, and the cosine schedule with linear warm-up."""

from __future__ import annotations

import math

import torch
from timm.optim import param_groups_layer_decay, param_groups_weight_decay
from torch import nn

from dmae_fast.train.config import OptimConfig

#: Parameters never decayed besides 1-d ones (norms, biases): position and class/mask tokens.
NO_DECAY = ("cls_token", "pos_embed", "mask_token", "decoder_pos_embed")


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """AdamW groups; with ``layer_decay`` (a timm ViT) each block's lr is scaled by
    ``layer_decay ** (depth + 1 - block)`` (BEiT/MAE fine-tuning), stored as ``lr_scale``."""
    if layer_decay is not None:
        return param_groups_layer_decay(model, weight_decay, NO_DECAY, layer_decay=layer_decay)
    return param_groups_weight_decay(model, weight_decay, no_weight_decay_list=NO_DECAY)


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise trust ratio (You et al. 2017), as MAE's linear probe.

    For each parameter of more than one dimension the update ``g + wd * p`` is scaled by
    ``trust * ||p|| / ||g + wd * p||`` (when both norms are positive); 1-d parameters
    (biases, norms) take plain momentum SGD steps.
    """

    def __init__(self, params, lr: float = 0.0, weight_decay: float = 0.0, momentum: float = 0.9,
                 trust: float = 0.001) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "trust": trust})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = p.grad
                if p.ndim > 1:
                    update = update.add(p, alpha=group["weight_decay"])
                    p_norm, u_norm = torch.norm(p), torch.norm(update)
                    ratio = torch.where((p_norm > 0) & (u_norm > 0), group["trust"] * p_norm / u_norm, 1.0)
                    update = update * ratio
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                state["mu"].mul_(group["momentum"]).add_(update)
                p.add_(state["mu"], alpha=-group["lr"])


def build_optimizer(groups: list[dict], config: OptimConfig) -> torch.optim.Optimizer:
    if config.optimizer == "lars":
        return LARS(groups, lr=config.peak_lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(groups, lr=config.peak_lr, betas=config.betas)


def learning_rate(progress: float, config: OptimConfig) -> float:
    """lr at ``progress`` epochs (fractional): linear warm-up, then half-cosine to min_lr."""
    peak = config.peak_lr
    if progress < config.warmup_epochs:
        return peak * progress / config.warmup_epochs
    span = max(config.epochs - config.warmup_epochs, 1e-12)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, (progress - config.warmup_epochs) / span)))
    return config.min_lr + (peak - config.min_lr) * cosine


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
