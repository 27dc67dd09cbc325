"""``dmae-bench scaling``: dmae-certify with 1, 2, ... processes; speedup and efficiency.

    dmae-bench scaling --procs 1 2 4 8 -- --ckpt m.safetensors --data /imagenet/val --skip 50 --fast
"""

from __future__ import annotations

import argparse
import sys

from dmae_fast.base.command import Parser
from dmae_fast.bench.command import run_subcommand
from dmae_fast.bench.config import DEFAULT_CERTIFY, ScalingConfig

PROG = "dmae-bench scaling"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Run the same dmae-certify command with 1, 2, ... processes "
                    "(--nproc-per-node), interleaved; write <date>-<device>-scaling.json/.md with samples/s, "
                    "speedup and efficiency. Arguments after -- go to dmae-certify "
                    f"(default: {' '.join(DEFAULT_CERTIFY)}).")
    parser.add_argument("--out", default="bench/results", help="output directory (default bench/results)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts (default 1 2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are kept (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process (default 1; "
                        "0: dmae-certify's own choice, e.g. on GPUs)")
    return parser


def main(argv: list[str] | None = None) -> int:
    def config() -> ScalingConfig:
        args_list = sys.argv[1:] if argv is None else list(argv)
        split = args_list.index("--") if "--" in args_list else len(args_list)
        args = build_parser().parse_args(args_list[:split])
        return ScalingConfig(out=args.out, procs=tuple(args.procs), rounds=args.rounds, threads=args.threads or None,
                             certify=tuple(args_list[split + 1:]) or DEFAULT_CERTIFY)

    return run_subcommand(PROG, config, "dmae_fast.bench.scaling:run_scaling")
