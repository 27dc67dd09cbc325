"""``dmae-train``: DMAE pre-training, fine-tuning, linear probing and the pre-training figure.

    dmae-train pretrain  [--preset NAME] [--set FIELD=VALUE ...] [--init PATH] --out DIR
    dmae-train finetune  [--preset NAME] [--set ...] --init PRETRAINED --out DIR
    dmae-train linprobe  [--preset NAME] [--set ...] --init PRETRAINED --out DIR
    dmae-train visualize [--preset NAME] [--set ...] --init PRETRAINED --out FIGURE.png
    dmae-train pretrain|finetune|linprobe --resume --out DIR      (continue a run exactly)
    dmae-train presets                                             (list the presets)

Every training subcommand runs unchanged under ``torchrun --nproc-per-node K``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

# Only light modules here (the checkpointing module, which imports torch, is imported where a run
# needs it): --help, option errors and 'dmae-train presets' answer without importing torch.
from dmae_fast.certification.choices import DEMO, DEMO_CHECKPOINT
from dmae_fast.cli.common import Parser, import_torch_while_starting, run_reporting_errors
from dmae_fast.errors import Interrupted, UserError
from dmae_fast.locking import OutputLock
from dmae_fast.train import config as cfg

PROG = "dmae-train"
TRAINING = ("pretrain", "finetune", "linprobe")


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="DMAE pre-training, robust fine-tuning and linear probing.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in (*TRAINING, "visualize"):
        sub = commands.add_parser(name, help=(cfg.CONFIGS[name].__doc__ or "").splitlines()[0])
        sub.add_argument("--preset", help="start from a named recipe (dmae-train presets lists them)")
        sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                         help="override a config field, e.g. optim.epochs=10, data.holdout=0.1 (repeatable)")
        sub.add_argument("--init", help="pre-trained checkpoint to start from (official DMAE/MAE file or ours)")
        sub.add_argument("--show-config", action="store_true", help="print the resolved config as JSON and exit")
        if name == "visualize":
            sub.add_argument("--out", type=_path, default=Path("dmae-visualize.png"), help="PNG file to write")
            continue
        sub.add_argument("--out", type=_path, help="run directory (config, checkpoints, logs, result)")
        sub.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
        sub.add_argument("--stop-after-epochs", type=int, metavar="K",
                         help="stop once K epochs of the schedule are done (continue later with --resume)")
        sub.add_argument("--quiet", action="store_true", help="no progress bar")
    commands.add_parser("presets", help="list the presets and their subcommands")
    return parser


def _path(text: str) -> Path:
    """A path argument; an empty one would mean the current directory."""
    if not text:
        raise argparse.ArgumentTypeError("empty path")
    return Path(text)


def _resolve(args) -> object:
    if getattr(args, "resume", False):
        if args.preset or args.overrides or args.init is not None:
            raise UserError("--resume continues with the configuration saved in --out; "
                            "do not combine it with --preset, --set or --init")
        if args.out is None:
            raise UserError("--resume needs --out DIR (the run directory to continue)")
        from dmae_fast.train.checkpointing import CONFIG, read_config

        config = cfg.from_json(read_config(args.out), str(args.out / CONFIG))
        kind = cfg.to_json(config)["subcommand"]
        if kind != args.command:
            raise UserError(f"{args.out} holds a '{kind}' run, not '{args.command}'")
        return config
    overrides = list(args.overrides)
    if args.init == "":
        raise UserError("--init: empty path")
    if args.init is not None:
        init = str(DEMO_CHECKPOINT) if args.init == DEMO else args.init  # as dmae-certify --ckpt demo
        overrides.append(("checkpoint=" if args.command == "visualize" else "init=") + init)
    return cfg.resolve(args.command, args.preset, overrides)


def _check_out(args) -> None:
    """Never overwrite a run: a new run needs a directory without one."""
    from dmae_fast.train.checkpointing import CHECKPOINT, CONFIG

    if args.out is None:
        raise UserError("--out DIR is required (the run directory)")
    for path in (args.out, *args.out.parents):
        if path.exists() and not path.is_dir():
            raise UserError(f"--out {args.out}: {path} exists and is not a directory")
    if args.resume:
        if not (args.out / CONFIG).is_file():
            raise UserError(f"--resume: no {CONFIG} in {args.out} (no run to continue)")
    elif (args.out / CONFIG).exists() or (args.out / CHECKPOINT).exists():
        raise UserError(f"{args.out} already holds a run; continue it with --resume or choose another --out")
    if args.stop_after_epochs is not None and args.stop_after_epochs < 1:
        raise UserError("--stop-after-epochs must be at least 1")


def _prepare(args, config, context):
    """The data, the task and whether to resume, every input checked (data, batch, --init,
    the checkpoint to continue) before anything is written."""
    from dmae_fast.train.checkpointing import CHECKPOINT, check_resumable
    from dmae_fast.train.datasets import open_training_data
    from dmae_fast.train.finetune import FinetuneTask
    from dmae_fast.train.loop import _micro_batch
    from dmae_fast.train.pretrain import PretrainTask
    from dmae_fast.train.randomness import seed_global_rngs

    data = open_training_data(config.data, config.seed)
    _micro_batch(config, context, len(data.train))
    seed_global_rngs(config.seed)  # identical initial weights on every rank
    task = PretrainTask(config, data) if args.command == "pretrain" else FinetuneTask(config, data)
    # A run stopped before its first checkpoint starts from the beginning on --resume.
    resume = args.resume and (args.out / CHECKPOINT).exists()
    if resume:
        done = check_resumable(args.out, cfg.to_json(config), task.model)
        if args.stop_after_epochs is not None and args.stop_after_epochs < done:
            raise UserError(f"--stop-after-epochs {args.stop_after_epochs}: the run in {args.out} "
                            f"has already done {done} epochs")
    elif args.resume and context.is_main:
        print(f"{PROG}: --resume: no {CHECKPOINT} yet in {args.out}; starting the run from its first epoch",
              file=sys.stderr)
    if args.command != "pretrain" and not config.init and context.is_main:
        print(f"{PROG}: note: no --init: the encoder starts from random weights", file=sys.stderr)
    return data, task, resume


def _train_locked(args, config, context, held: contextlib.ExitStack):
    """Rank 0 locks the run directory (a second writer is refused) and keeps status.json."""
    from dmae_fast.train.checkpointing import write_config, write_status
    from dmae_fast.train.distributed import barrier
    from dmae_fast.train.loop import train

    data, task, resume = _prepare(args, config, context)
    barrier(context)  # every rank has checked --out before rank 0 creates it
    if context.is_main:
        args.out.mkdir(parents=True, exist_ok=True)
        held.enter_context(OutputLock(args.out, "run directory"))
        _check_out(args)  # again, under the lock: another run may have started meanwhile
        if not args.resume:
            write_config(args.out, cfg.to_json(config))
        write_status(args.out, "running")
    barrier(context)
    try:
        summary = train(config, task, data, context, args.out, resume=resume,
                        stop_after=args.stop_after_epochs, progress=not args.quiet)
    except Interrupted as stop:
        if context.is_main:
            write_status(args.out, "interrupted")
        stop.kept = (f"{args.out} keeps its last end-of-epoch checkpoint; continue with: "
                     f"{PROG} {args.command} --resume --out {args.out}")
        raise
    if context.is_main:
        write_status(args.out, "complete" if summary.result is not None else "stopped",
                     epochs_done=summary.epochs_done)
    return summary


def run_training(args, config) -> int:
    from dmae_fast.train.distributed import setup, teardown

    _check_out(args)
    context = setup(config.device)
    try:
        with contextlib.ExitStack() as held:
            summary = _train_locked(args, config, context, held)
    finally:
        teardown(context)
    if context.is_main:
        if summary.result is None:
            print(f"stopped after epoch {summary.epochs_done} of {config.optim.epochs}; "
                  f"continue with: {PROG} {args.command} --resume --out {args.out}")
        else:
            loss = f"final loss {summary.final_loss:.4f}" if math.isfinite(summary.final_loss) else "no epoch left"
            chosen = f"; selected {summary.best}" if summary.best else ""
            print(f"wrote {summary.result} ({loss}{chosen})")
    return 0


def run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "presets":
        for name in sorted(cfg.PRESETS):
            print(f"{cfg.preset_kind(name):10s} {name}")
        return 0
    config = _resolve(args)
    if args.show_config:
        print(json.dumps(cfg.to_json(config), indent=2))
        return 0
    if args.command == "visualize":
        from dmae_fast.train.visualize import visualize

        print(f"wrote {visualize(config, args.out)}")
        return 0
    import_torch_while_starting(PROG)
    return run_training(args, config)


def main(argv: list[str] | None = None) -> int:
    return run_reporting_errors(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
