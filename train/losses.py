"""Fine-tuning losses: cross-entropy under noise and consistency regularization.

Consistency regularization (Jeong & Shin, NeurIPS 2020), as DMAE uses it: every image is
seen in ``m`` independently noised copies with logits z_1..z_m; with p_i = softmax(z_i)
and the mean prediction p = (1/m) sum_i p_i,

    loss = CE (averaged over all copies)
           + lambda * (1/m) sum_i KL(p || p_i)
           + eta * H(p),          H(p) = -sum_c p_c log(max(p_c, 1e-20)),

each term averaged over the batch. With m = 1 and lambda = eta = 0 it is plain RS training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossParts:
    total: torch.Tensor
    cross_entropy: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean CE for hard labels [N] (with label smoothing) or soft targets [N, C] (mixup)."""
    if target.ndim == 2:
        return torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()
    return F.cross_entropy(logits, target, label_smoothing=label_smoothing)


def consistency_loss(
    logits: torch.Tensor, target: torch.Tensor, lam: float, eta: float, label_smoothing: float = 0.0
) -> LossParts:
    """``logits`` [m, B, C] of m noisy copies of B images; ``target`` [B] or [B, C]."""
    copies = logits.shape[0]
    targets = target.expand(copies, *target.shape).flatten(0, 1)
    ce = cross_entropy(logits.flatten(0, 1).float(), targets, label_smoothing)
    log_p = F.log_softmax(logits.float(), dim=-1)  # [m, B, C]
    mean_p = log_p.exp().mean(dim=0)  # [B, C]
    log_mean = torch.log(mean_p.clamp_min(1e-20))
    kl = (mean_p * (log_mean - log_p)).sum(-1).mean()  # mean over copies and batch
    entropy = -(mean_p * log_mean).sum(-1).mean()
    return LossParts(ce + lam * kl + eta * entropy, ce, kl, entropy)
