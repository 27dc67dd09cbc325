"""``dmae-bench``: throughput and end-to-end certification timings, reference loops vs ours; a parser over
:func:`dmae_fast.bench.suite.run_bench`, which writes DIR/<date>-<device>[-throughput|-certify].json, .md and .png
(docs/performance.md). Its subcommands cpu, serve, scaling and stall: command_cpu.py, command_serve.py and so on."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dmae_fast.base.command import Parser, import_torch_while_starting, run_reporting_errors
from dmae_fast.base.errors import UserError

# Only light modules here: --help and option errors answer without importing torch.
from dmae_fast.bench.config import MODELS, PROG, VARIANT_KEYS, BenchConfig

# Options only one stage reads: naming one for the other stage alone is an error, not ignored.
THROUGHPUT_ONLY = ("models", "batches", "main_batch", "seconds", "engines", "export_models", "engine_dir", "variants")
CERTIFY_ONLY = ("certify_model", "images", "n0", "n", "reference_budget_s")
SUBCOMMANDS = ("cpu", "serve", "scaling", "stall")  # dmae-bench NAME: dmae_fast.bench.command_NAME


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Throughput (noisy samples/s) and end-to-end CERTIFY timings of the "
                    "reference loops (Cohen et al., DMAE) and ours, on one device.")
    parser.add_argument("command", nargs="?", choices=["throughput", "certify"], help="only the throughput table, or "
                        "only the CERTIFY timing ('dmae-bench cpu --help': the CPU comparison at equal thread counts)")
    parser.add_argument("--all", action="store_true", help="throughput sweeps for every model and variant, then "
                        "the CERTIFY timing, within --budget seconds")
    parser.add_argument("--smoke", action="store_true", help="a few seconds on the CPU with a tiny model")
    parser.add_argument("--out", default="bench/results", help="output directory (default bench/results)")
    parser.add_argument("--models", nargs="+", help=f"throughput models: {', '.join(MODELS)}")
    parser.add_argument("--batches", type=int, nargs="+", help="batch sizes of the sweep")
    parser.add_argument("--main-batch", type=int, help="the batch size every variant is measured at (default 512)")
    parser.add_argument("--seconds", type=float, help="timed seconds per throughput row (default 3)")
    parser.add_argument("--budget", dest="budget_s", type=float, help="total seconds; later rows are skipped "
                        "(default 480)")
    parser.add_argument("--compile-mode", help="torch.compile mode (default 'default'; 'max-autotune' compiles "
                        "for minutes)")
    parser.add_argument("--variants", nargs="+", help=f"only these of our variants ({', '.join(VARIANT_KEYS)}; "
                        "default all)")
    parser.add_argument("--precisions", nargs="+", help="our variants' precisions on CUDA (fp16 bf16 fp8; "
                        "default fp16 bf16); the CERTIFY timing runs the first")
    parser.add_argument("--engines", nargs="+", help="your exported engine files (.onnx, .pt2, .engine) to time too")
    parser.add_argument("--export-models", nargs="*", help="models exported to engines and timed (default vit-b16 "
                        "demo; none: no exports)")
    parser.add_argument("--engine-dir", help="where the exported engines go (default: --out); a folder "
                        "<stem>-engines is made inside")
    parser.add_argument("--certify-model", help="model of the CERTIFY timing (default vit-b16)")
    parser.add_argument("--images", type=int, help="images in the CERTIFY timing (default 20)")
    parser.add_argument("--n0", type=int, help="selection samples (default 100)")
    parser.add_argument("--n", type=int, help="estimation samples (default 10,000)")
    parser.add_argument("--reference-budget", dest="reference_budget_s", type=float,
                        help="seconds per reference loop in the CERTIFY timing (default 30)")
    parser.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    return parser


def _config_from_args(args: argparse.Namespace) -> BenchConfig:
    if sum([args.all, args.smoke, args.command is not None]) != 1:
        raise UserError("choose one of: --all, --smoke, throughput, certify")
    base = BenchConfig.smoke_run(args.out, args.device or "cpu") if args.smoke else BenchConfig(args.out)
    if args.command is not None:
        base = replace(base, throughput=args.command == "throughput", certify=args.command == "certify")
    fields = (*THROUGHPUT_ONLY, *CERTIFY_ONLY, "precisions", "budget_s", "compile_mode", "device")
    values = {k: getattr(args, k) for k in fields if getattr(args, k) is not None}
    if "engine_dir" in values and "export_models" in values and not values["export_models"]:
        raise UserError("--engine-dir is where exported engines go, but --export-models names none")
    unused = {"certify": THROUGHPUT_ONLY, "throughput": CERTIFY_ONLY}.get(args.command, ())
    if ignored := ["--" + field.removesuffix("_s").replace("_", "-") for field in unused if field in values]:
        stage = "the throughput table" if args.command == "certify" else "the CERTIFY timing"
        raise UserError(f"'dmae-bench {args.command}' does not use {', '.join(ignored)} (options of {stage})")
    return replace(base, **{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})  # nargs: tuples


def _run(argv: list[str]) -> int:
    config = _config_from_args(build_parser().parse_args(argv))
    config.validate()  # before torch is imported: option errors answer at once
    import_torch_while_starting(PROG)
    from dmae_fast.bench.suite import run_bench

    return run_bench(config)


def run_subcommand(prog: str, config: Callable[[], Any], runner: str) -> int:
    """A subcommand: its ``config()`` (options parsed before anything heavy is imported), validated, then run by
    ``runner`` ("module:function", returning (results, (json, md))); prints the table and the files written."""

    def body() -> int:
        settings = config()
        settings.validate()
        module, name = runner.split(":")
        _, paths = getattr(importlib.import_module(module), name)(settings)
        print(paths[1].read_text(encoding="utf-8"))
        print(f"{prog}: wrote {', '.join(map(str, paths))}", file=sys.stderr)
        return 0

    return run_reporting_errors(prog, body)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(f"dmae_fast.bench.command_{argv[0]}").main(argv[1:])
    return run_reporting_errors(PROG, lambda: _run(argv))


if __name__ == "__main__":
    sys.exit(main())
