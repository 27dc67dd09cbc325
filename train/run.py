"""A training run in its directory: the checks of the directory and of every input, the lock,
``status.json``, the process group and its barriers, and resuming, around :func:`loop.train`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from dmae_fast.base.errors import Interrupted, UserError
from dmae_fast.base.locking import OutputLock
from dmae_fast.train import config as cfg
from dmae_fast.train.checkpointing import CHECKPOINT, CONFIG, check_resumable, write_config, write_status
from dmae_fast.train.config import TrainingConfig
from dmae_fast.train.datasets import TrainingData, open_training_data
from dmae_fast.train.distributed import Context, barrier, setup, teardown
from dmae_fast.train.finetune import FinetuneTask
from dmae_fast.train.loop import Summary, Task, micro_batch_size, train
from dmae_fast.train.pretrain import PretrainTask
from dmae_fast.train.randomness import seed_global_rngs


def check_out(out: Path, resume: bool, stop_after: int | None) -> None:
    """Never overwrite a run: a new run needs a directory without one."""
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            raise UserError(f"--out {out}: {path} exists and is not a directory")
    if resume:
        if not (out / CONFIG).is_file():
            raise UserError(f"--resume: no {CONFIG} in {out} (no run to continue)")
    elif (out / CONFIG).exists() or (out / CHECKPOINT).exists():
        raise UserError(f"{out} already holds a run; continue it with --resume or choose another --out")
    if stop_after is not None and stop_after < 1:
        raise UserError("--stop-after-epochs must be at least 1")


def run_training(config: TrainingConfig, out: Path, *, resume: bool = False, stop_after: int | None = None,
                 progress: bool = True, tell: Callable[[str], None], continue_with: str) -> Summary | None:
    """Run ``config`` in ``out`` (``resume``: continue the run there) on this process's rank, under
    torchrun too; ``stop_after``: stop once that many epochs are done. Notes for the user go to
    ``tell`` (from the first rank only); ``continue_with``, the command that continues the run, is
    what an interruption says. Returns the summary on the first rank, None on the others."""
    check_out(out, resume, stop_after)
    context = setup(config.device)
    try:
        with contextlib.ExitStack() as held:
            summary = _train_locked(config, out, context, held, resume, stop_after, progress, tell, continue_with)
    finally:
        teardown(context)
    return summary if context.is_main else None


def _prepare(config: TrainingConfig, out: Path, context: Context, resume: bool, stop_after: int | None,
             tell: Callable[[str], None]) -> tuple[TrainingData, Task, bool]:
    """The data, the task and whether to resume, every input checked (data, batch, --init,
    the checkpoint to continue) before anything is written."""
    data = open_training_data(config.data, config.seed)
    micro_batch_size(config, context, len(data.train))
    seed_global_rngs(config.seed)  # identical initial weights on every rank
    pretrain = isinstance(config, cfg.PretrainConfig)
    task = PretrainTask(config, data) if pretrain else FinetuneTask(config, data)
    # A run stopped before its first checkpoint starts from the beginning on --resume.
    from_checkpoint = resume and (out / CHECKPOINT).exists()
    if from_checkpoint:
        done = check_resumable(out, cfg.to_json(config), task.model)
        if stop_after is not None and stop_after < done:
            raise UserError(f"--stop-after-epochs {stop_after}: the run in {out} has already done {done} epochs")
    elif resume and context.is_main:
        tell(f"--resume: no {CHECKPOINT} yet in {out}; starting the run from its first epoch")
    if not pretrain and not config.init and context.is_main:
        tell("note: no --init: the encoder starts from random weights")
    return data, task, from_checkpoint


def _train_locked(config: TrainingConfig, out: Path, context: Context, held: contextlib.ExitStack, resume: bool,
                  stop_after: int | None, progress: bool, tell: Callable[[str], None], continue_with: str) -> Summary:
    """Rank 0 locks the run directory (a second writer is refused) and keeps status.json."""
    data, task, from_checkpoint = _prepare(config, out, context, resume, stop_after, tell)
    barrier(context)  # every rank has checked --out before rank 0 creates it
    if context.is_main:
        out.mkdir(parents=True, exist_ok=True)
        held.enter_context(OutputLock(out, "run directory"))
        check_out(out, resume, stop_after)  # again, under the lock: another run may have started meanwhile
        if not resume:
            write_config(out, cfg.to_json(config))
        write_status(out, "running")
    barrier(context)
    try:
        summary = train(config, task, data, context, out, resume=from_checkpoint,
                        stop_after=stop_after, progress=progress)
    except Interrupted as stop:
        if context.is_main:
            write_status(out, "interrupted")
        stop.kept = f"{out} keeps its last end-of-epoch checkpoint; continue with: {continue_with}"
        raise
    if context.is_main:
        write_status(out, "complete" if summary.result is not None else "stopped", epochs_done=summary.epochs_done)
    return summary
