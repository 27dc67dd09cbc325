"""torchrun support: process group from the environment, rank-0 helpers.

``torchrun --nproc-per-node K`` (or ``python -m torch.distributed.run``) sets RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; multi-node launches add
``--nnodes``/``--rdzv-*`` and need nothing else here. NCCL is used on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dmae_fast.base.errors import UserError


@dataclass(frozen=True)
class Context:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto") -> Context:
    """Join the process group when launched by torchrun; pick this process's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise UserError(f"--set device={device}: CUDA is not available on this machine")
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise UserError(f"device must be auto, cpu or cuda[:N], got {device!r}")
    chosen = torch.device("cuda", local if device in ("auto", "cuda") else torch.device(device).index or 0) \
        if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(chosen)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")
    return Context(rank, world, local, chosen)


def barrier(context: Context) -> None:
    if context.distributed:
        dist.barrier()


def teardown(context: Context) -> None:
    if context.distributed and dist.is_initialized():
        dist.destroy_process_group()


def mean_over_ranks(value: float, context: Context) -> float:
    """A scalar's mean over all processes (for logging)."""
    if not context.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=context.device)
    dist.all_reduce(tensor)
    return tensor.item() / context.world_size
