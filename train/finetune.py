"""Fine-tuning and linear probing of a pre-trained encoder into a smoothing base classifier.

Noise is added to the [0, 1] images (per-sample sigma when ``sigma_range`` is set), then
mixup/cutmix, as the paper does; with consistency regularization every image is seen in
m noisy copies that share one mixup draw. Linear probing freezes the encoder and trains
BatchNorm1d(affine=False) + linear. Model selection uses a held-out part of the TRAINING
data: clean accuracy and a noisy majority-vote accuracy (``eval_noise_samples`` copies at
``sigma``), the latter selects ``classifier.safetensors``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from timm.data import Mixup
from torch import nn

from dmae_fast.base.errors import UserError
from dmae_fast.model.checkpoints import encoder_state, save_classifier
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.model.config import ClassifierSpec
from dmae_fast.train.config import FinetuneConfig, LinprobeConfig, to_json
from dmae_fast.train.datasets import TrainingData
from dmae_fast.train.loop import Task
from dmae_fast.train.losses import consistency_loss, cross_entropy
from dmae_fast.train.optim import param_groups
from dmae_fast.train.randomness import Stream, gaussians, uniforms

RESULT, LAST = "classifier.safetensors", "classifier-last.safetensors"
EVAL_BATCH = 256


def build_classifier(config: FinetuneConfig | LinprobeConfig, data: TrainingData) -> SmoothingClassifier:
    """The classifier for ``data`` with the encoder weights of ``config.init`` (if any)."""
    probe = isinstance(config, LinprobeConfig)
    ranged = getattr(config, "sigma_range", None)
    spec = ClassifierSpec(
        encoder=config.encoder_config, num_classes=data.num_classes, input_size=data.input_size,
        mean=data.mean, std=data.std, pool=config.pool, head="bn_linear" if probe else "linear",
        sigma=None if ranged else config.sigma, class_names=data.class_names,
        provenance={"trained_by": "dmae-train " + ("linprobe" if probe else "finetune"), "init": config.init,
                    "torch": torch.__version__},
    )
    model = SmoothingClassifier(spec, drop_path_rate=0.0 if probe else config.drop_path)
    if config.init:
        _load_encoder(model, config)
    linear = model.head[1] if probe else model.head
    nn.init.trunc_normal_(linear.weight, std=config.head_init_std)
    nn.init.zeros_(linear.bias)
    if probe:
        for name, parameter in model.named_parameters():
            parameter.requires_grad = name.startswith("head.")
    return model


#: The encoder's tensors in a classifier's state dict: what ``--init`` must supply, all of them.
ENCODER_KEYS = ("cls_token", "pos_embed", "patch_embed.", "blocks.")


def _load_encoder(model: SmoothingClassifier, config: FinetuneConfig | LinprobeConfig) -> None:
    """The encoder weights of ``config.init``; UserError unless they are exactly this encoder's."""
    state = encoder_state(config.init, config.encoder_config.grid_size)
    expected = {k: v for k, v in model.state_dict().items() if k.startswith(ENCODER_KEYS)}
    wrong = [k for k in state if k not in expected or expected[k].shape != state[k].shape]
    missing = [k for k in expected if k not in state]
    if wrong or missing:
        shown = ", ".join((wrong or missing)[:3])
        raise UserError(f"{config.init} does not fit the {config.encoder!r} encoder "
                        f"({'wrong or unknown' if wrong else 'missing'}: {shown})")
    model.load_state_dict(state, strict=False)


class FinetuneTask(Task):
    selection_metric = "noisy_vote_acc"

    def __init__(self, config: FinetuneConfig | LinprobeConfig, data: TrainingData) -> None:
        self.config, self.model = config, build_classifier(config, data)
        self.probe = isinstance(config, LinprobeConfig)
        self.copies = 1 if self.probe or config.consistency is None else config.consistency.copies
        mix = not self.probe and (config.mixup > 0 or config.cutmix > 0)
        self.mixup = Mixup(mixup_alpha=config.mixup, cutmix_alpha=config.cutmix,
                           label_smoothing=config.label_smoothing, num_classes=data.num_classes) if mix else None

    def param_groups(self) -> list[dict]:
        c = self.config
        if self.probe:
            return [{"params": [p for p in self.model.parameters() if p.requires_grad],
                     "weight_decay": c.optim.weight_decay}]
        return param_groups(self.model, c.optim.weight_decay, c.layer_decay)

    def noisy_copies(self, images: torch.Tensor, index: torch.Tensor, epoch: int) -> torch.Tensor:
        """[m, B, C, H, W]: each copy with its own noise, per-sample sigma if a range is set."""
        c, shape = self.config, tuple(images.shape[1:])
        sigma: torch.Tensor | float = c.sigma
        if getattr(c, "sigma_range", None):
            lo, hi = c.sigma_range
            sigma = (lo + (hi - lo) * uniforms(c.seed, Stream.SIGMA, index, epoch, 1)).view(-1, 1, 1, 1)
        return torch.stack([
            images + sigma * gaussians(c.seed, Stream.FINETUNE_NOISE, index, epoch * self.copies + k, shape)
            for k in range(self.copies)
        ])

    def loss(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, index: torch.Tensor,
             epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        noisy, target = self.noisy_copies(images, index, epoch), labels
        m, b = noisy.shape[:2]
        if self.mixup is not None:  # one mixup draw for all copies: mix them as extra channels
            stacked = noisy.transpose(0, 1).flatten(1, 2)
            stacked, target = self.mixup(stacked, labels)
            noisy = stacked.unflatten(1, (m, -1)).transpose(0, 1)
        logits = model(noisy.flatten(0, 1)).unflatten(0, (m, b))
        smoothing = 0.0 if self.probe else c.label_smoothing
        if self.copies == 1 or self.probe:
            return cross_entropy(logits[0].float(), target, smoothing), {}
        parts = consistency_loss(logits, target, c.consistency.lam, c.consistency.eta, smoothing)
        return parts.total, {"ce": parts.cross_entropy.item(), "kl": parts.kl.item(), "entropy": parts.entropy.item()}

    @torch.no_grad()
    def evaluate(self, data: TrainingData, device: torch.device) -> dict[str, float]:
        """Clean accuracy and majority-vote accuracy over noisy copies on the held-out split."""
        c, model, held = self.config, self.model, data.holdout
        clean = vote = 0
        for start in range(0, len(held), EVAL_BATCH):
            items = [held[i] for i in range(start, min(start + EVAL_BATCH, len(held)))]
            images = torch.stack([x for x, _, _ in items]).to(device)
            labels = torch.tensor([y for _, y, _ in items], device=device)
            index = torch.tensor([i for _, _, i in items], device=device)
            clean += (model(images).argmax(1) == labels).sum().item()
            counts = torch.zeros(len(items), model.spec.num_classes, device=device)
            for k in range(c.eval_noise_samples):
                noise = gaussians(c.seed, Stream.EVAL_NOISE, index, k, tuple(images.shape[1:]))
                counts += nn.functional.one_hot(model(images + c.sigma * noise).argmax(1), counts.shape[1])
            vote += (counts.argmax(1) == labels).sum().item()
        return {"clean_acc": clean / len(held), "noisy_vote_acc": vote / len(held)}

    def save(self, out: Path, tag: str, info: dict[str, Any]) -> Path:
        model = self.model
        provenance = {**model.spec.provenance, "config": to_json(self.config), **info}
        model.spec = replace(model.spec, provenance=provenance)
        path = save_classifier(model, out / (RESULT if tag == "best" else LAST))
        if tag == "last" and info.get("selected") is None:
            save_classifier(model, out / RESULT)
        return path
