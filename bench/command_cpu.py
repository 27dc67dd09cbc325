"""``dmae-bench cpu``: the reference loops and ours on this CPU, at equal thread counts
(:func:`dmae_fast.bench.cpu.run_cpu_bench`)."""

from __future__ import annotations

import argparse

from dmae_fast.base.command import Parser
from dmae_fast.bench.command import run_subcommand

PROG = "dmae-bench cpu"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Cohen et al.'s and DMAE's certification loops against ours (plain, "
                    "compiled noise, --fast, compiled body, bf16) on the CPU, interleaved, at equal thread counts; "
                    "writes <date>-cpu-cpu.json/.md")
    parser.add_argument("--out", default="bench/results", help="output directory (default bench/results)")
    parser.add_argument("--models", nargs="+", help="default: all (demo, small-32, small-224)")
    parser.add_argument("--threads", type=int, nargs="+", help="thread counts (default 1 2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are kept (default 3)")
    parser.add_argument("--quick", action="store_true", help="tiny sample counts: seconds, for checking the setup")
    parser.add_argument("--commands", type=int, nargs="*", metavar="IMAGES", help="also time whole commands "
                        "(start-up included: Cohen et al.'s loop as a program, dmae-certify plain and fast) on this "
                        "many demo digits each (default 10 100; none with --quick; '--commands' alone: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    def config():
        args = build_parser().parse_args(argv)  # before torch: --help and option errors answer at once
        from dmae_fast.bench.cpu import CpuBenchConfig

        commands = args.commands if args.commands is not None else ([] if args.quick else [10, 100])
        return CpuBenchConfig(out=args.out, rounds=args.rounds, quick=args.quick, commands=tuple(commands),
                              **{k: tuple(v) for k, v in (("models", args.models), ("threads", args.threads)) if v})

    return run_subcommand(PROG, config, "dmae_fast.bench.cpu:run_cpu_bench")
