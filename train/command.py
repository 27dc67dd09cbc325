"""``dmae-train``: DMAE pre-training, fine-tuning, linear probing and the pre-training figure (``visualize``),
each from a preset and ``--set`` overrides; ``--resume --out DIR`` continues a run exactly, ``presets`` lists the
presets. Every training subcommand runs unchanged under ``torchrun --nproc-per-node K``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from dmae_fast.base.command import Parser, import_torch_while_starting, run_reporting_errors
from dmae_fast.base.errors import UserError

# Only light modules here (the checkpointing module and the run, which import torch, are imported
# where a run needs them): --help, option errors and 'dmae-train presets' answer without importing torch.
from dmae_fast.demo_files import DEMO, DEMO_CHECKPOINT
from dmae_fast.train import config as cfg
from dmae_fast.train.inputs import check_inputs_before_loading

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


def _train(args, config) -> int:
    """Run (or continue) the training subcommand in --out and report its result."""
    from dmae_fast.train.run import run_training

    if args.out is None:
        raise UserError("--out DIR is required (the run directory)")
    again = f"{PROG} {args.command} --resume --out {args.out}"
    summary = run_training(config, args.out, resume=args.resume, stop_after=args.stop_after_epochs,
                           progress=not args.quiet, tell=lambda line: print(f"{PROG}: {line}", file=sys.stderr),
                           continue_with=again)
    if summary is None:  # not the first rank: it reports nothing
        return 0
    if summary.result is None:
        print(f"stopped after epoch {summary.epochs_done} of {config.optim.epochs}; continue with: {again}")
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
    check_inputs_before_loading(config)
    if args.command == "visualize":
        from dmae_fast.train.visualize import visualize

        print(f"wrote {visualize(config, args.out)}")
        return 0
    import_torch_while_starting(PROG)
    return _train(args, config)


def main(argv: list[str] | None = None) -> int:
    return run_reporting_errors(PROG, lambda: run(argv))


if __name__ == "__main__":
    sys.exit(main())
