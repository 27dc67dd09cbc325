"""The training loop every subcommand shares.

A :class:`Task` (pre-training, fine-tuning, linear probing) supplies the model, its
parameter groups, the loss of a micro-batch, an evaluation on the held-out split and how
to write its result. :func:`train` does the rest: DistributedDataParallel under torchrun,
a DistributedSampler (also with one process, so the data order is the same), gradient
accumulation, mixed precision (bf16 autocast, or fp16 with a gradient scaler), gradient
clipping, the per-step learning-rate schedule, model selection on the held-out split,
logging and resumable checkpoints at epoch ends (rank 0 writes).
"""

from __future__ import annotations

import contextlib
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from dmae_fast.base.errors import UserError
from dmae_fast.train.checkpointing import (
    load_training_state,
    rng_state,
    save_training_state,
    set_rng_state,
)
from dmae_fast.train.config import OptimConfig, RunConfig, to_json
from dmae_fast.train.datasets import TrainingData
from dmae_fast.train.distributed import Context, barrier, mean_over_ranks
from dmae_fast.train.optim import build_optimizer, learning_rate, set_learning_rate
from dmae_fast.train.runlog import RunLog


class Task(ABC):
    """One kind of training: the model and what to do with a batch."""

    model: nn.Module
    selection_metric: str | None = None  # held-out metric to maximize (None: keep the last)

    @abstractmethod
    def param_groups(self) -> list[dict]: ...

    @abstractmethod
    def loss(self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, index: torch.Tensor,
             epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The mean loss of a micro-batch (``model`` may be the DDP wrapper) and extra metrics."""

    def evaluate(self, data: TrainingData, device: torch.device) -> dict[str, float]:
        """Metrics on the held-out split (called on rank 0 only)."""
        return {}

    @abstractmethod
    def save(self, out: Path, tag: str, info: dict[str, Any]) -> Path:
        """Write the result (``tag``: ``best`` or ``last``) and return its path."""


@dataclass(frozen=True)
class Summary:
    epochs_done: int
    final_loss: float
    result: Path | None
    best: dict[str, Any] | None


def micro_batch_size(config: RunConfig, context: Context, samples: int) -> int:
    """The images one rank puts through at a time; UserError if ``optim.batch_size`` does not split
    evenly over the ranks and accumulation steps, or ``samples`` training images are too few."""
    optim = config.optim
    parts = context.world_size * optim.accum_steps
    if optim.batch_size % parts:
        raise UserError(f"optim.batch_size {optim.batch_size} is not divisible by world size x accum_steps = {parts}")
    micro = optim.batch_size // parts
    if samples // context.world_size < micro:
        raise UserError(f"{samples} training images are fewer than one batch of {optim.batch_size}")
    return micro


def accumulate_gradients(task: Task, wrapped: nn.Module, micro_batches: Iterator, optim: OptimConfig,
                         context: Context, scaler: torch.amp.GradScaler, epoch: int) -> Iterator[tuple[float, dict]]:
    """Forward and backward of one optimizer step's ``optim.accum_steps`` micro-batches.

    Each micro-batch's mean loss is divided by ``accum_steps`` before its backward pass, so
    the summed ``.grad`` is the gradient of the mean loss over the step's samples, as one
    large batch would give (DDP synchronizes on the last micro-batch only). Yields each
    micro-batch's loss and metrics.
    """
    device = context.device
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(optim.precision)
    for k in range(optim.accum_steps):
        images, labels, index = (t.to(device, non_blocking=True) for t in next(micro_batches))
        last = k == optim.accum_steps - 1
        sync = contextlib.nullcontext() if last or not context.distributed else wrapped.no_sync()
        with sync:
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss, metrics = task.loss(wrapped, images, labels, index, epoch)
            scaler.scale(loss / optim.accum_steps).backward()
        yield loss.item(), metrics


def train(
    config: RunConfig,
    task: Task,
    data: TrainingData,
    context: Context,
    out: Path,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> Summary:
    """Run (or continue) the schedule; ``stop_after``: stop once that many epochs are done."""
    optim, device = config.optim, context.device
    micro = micro_batch_size(config, context, len(data.train))
    sampler = DistributedSampler(data.train, context.world_size, context.rank, shuffle=True, seed=config.seed)
    loader_kwargs = {"batch_size": micro, "sampler": sampler, "drop_last": True,
                     "num_workers": config.data.num_workers,
                     "pin_memory": config.data.pin_memory and device.type == "cuda"}
    steps_per_epoch = (len(sampler) // micro) // optim.accum_steps
    model = task.model.to(device)
    wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if context.distributed else model
    optimizer = build_optimizer(task.param_groups(), optim)
    scaler = torch.amp.GradScaler(device.type, enabled=optim.precision == "fp16")
    start, best, loss_value = 0, None, math.nan
    if resume:
        state = load_training_state(out)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        start, best = state["epoch"], state["best"]
        set_rng_state(state["rng"])
    log = RunLog(out, context.is_main)
    result = None
    epochs_end = min(optim.epochs, stop_after) if stop_after is not None else optim.epochs
    bar = tqdm(total=(epochs_end - start) * steps_per_epoch, desc=f"{type(task).__name__} epochs {start}-{epochs_end}",
               disable=not (progress and context.is_main), dynamic_ncols=True)
    for epoch in range(start, epochs_end):
        sampler.set_epoch(epoch)
        data.train.set_epoch(epoch)
        model.train()
        totals: dict[str, float] = {}
        micro_batches = iter(DataLoader(data.train, **loader_kwargs))
        started = time.perf_counter()
        for step in range(steps_per_epoch):
            set_learning_rate(optimizer, learning_rate(epoch + step / steps_per_epoch, optim))
            for loss_value, metrics in accumulate_gradients(task, wrapped, micro_batches, optim, context,
                                                           scaler, epoch):
                if not math.isfinite(loss_value):
                    raise RuntimeError(f"loss is {loss_value} at epoch {epoch} step {step}; stopping")
                for key, value in {"loss": loss_value, **metrics}.items():
                    totals[key] = totals.get(key, 0.0) + value / (steps_per_epoch * optim.accum_steps)
            if optim.clip_grad is not None:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), optim.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            bar.update()
            bar.set_postfix(epoch=epoch, loss=f"{loss_value:.4f}")
        record: dict[str, Any] = {"epoch": epoch, "lr": optimizer.param_groups[0]["lr"] /
                                  optimizer.param_groups[0].get("lr_scale", 1.0),
                                  "seconds": round(time.perf_counter() - started, 2)}
        record.update({f"train_{k}": mean_over_ranks(v, context) for k, v in totals.items()})
        done = epoch + 1
        if context.is_main and data.holdout is not None and (done % config.eval_every == 0 or done == optim.epochs):
            model.eval()
            scores = task.evaluate(data, device)
            record.update({f"holdout_{k}": v for k, v in scores.items()})
            metric = task.selection_metric
            if metric in scores and (best is None or scores[metric] > best["value"]):
                best = {"metric": metric, "value": scores[metric], "epoch": epoch}
                task.save(out, "best", {"selected": best})
        log.write(record, step=done * steps_per_epoch)
        if done % config.save_every == 0 or done in (optim.epochs, epochs_end):
            if context.is_main:
                save_training_state(out, {
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "epoch": done, "best": best, "rng": rng_state(),
                    "config": to_json(config),
                })
            barrier(context)
    bar.close()
    if epochs_end == optim.epochs and context.is_main:
        result = task.save(out, "last", {"selected": best})
    log.close()
    barrier(context)
    return Summary(epochs_end, loss_value, result, best)
