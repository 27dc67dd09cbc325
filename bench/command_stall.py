"""``dmae-bench stall``: fixed-n against --sequential on an emulated asynchronous device (the GPU's wait for
decisions, made visible on a CPU): drawn samples/s, rows drawn but unused, the device's idle time.

    dmae-bench stall --images 16 1000 --caps 10000 100000 --out bench/results
"""

from __future__ import annotations

import argparse

from dmae_fast.base.command import Parser
from dmae_fast.bench.command import run_subcommand
from dmae_fast.bench.config import StallConfig

PROG = "dmae-bench stall"


def build_parser() -> argparse.ArgumentParser:
    defaults = StallConfig()
    parser = Parser(prog=PROG, description="Fixed-n CERTIFY and --sequential (the exact group-sequential test) over "
                    "the simulated ImageNet-shaped population, on an emulated asynchronous device: each batch takes "
                    "--batch-ms on a worker thread whatever its rows, and counts reach the host when it completes. "
                    "Writes <date>-cpu-stall.json/.md in --out: drawn samples/s of both, rows drawn but unused, the "
                    "device's idle time and how much of it waited for decisions.")
    parser.add_argument("--out", default=defaults.out, help=f"output directory (default {defaults.out})")
    parser.add_argument("--images", type=int, nargs="+", default=list(defaults.images),
                        help="image counts (default 16 1000)")
    parser.add_argument("--caps", type=int, nargs="+", default=list(defaults.caps),
                        help="n of fixed-n and cap of --sequential (default 10000 100000)")
    parser.add_argument("--n0", type=int, default=defaults.n0, help=f"selection samples (default {defaults.n0})")
    parser.add_argument("--sigma", type=float, default=defaults.sigma, help=f"default {defaults.sigma}")
    parser.add_argument("--alpha", type=float, default=defaults.alpha, help=f"default {defaults.alpha}")
    parser.add_argument("--batch", type=int, default=defaults.batch, help=f"rows per batch (default {defaults.batch})")
    parser.add_argument("--batch-ms", type=float, default=defaults.batch_ms,
                        help=f"the emulated device's time per batch (default {defaults.batch_ms:g})")
    parser.add_argument("--fixed-seconds", type=float, default=defaults.fixed_seconds,
                        help=f"a fixed-n run stops after this long (default {defaults.fixed_seconds:g})")
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="interleaved rounds; medians are kept "
                        f"(default {defaults.rounds})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help=f"noise seed (default {defaults.seed})")
    return parser


def main(argv: list[str] | None = None) -> int:
    def config() -> StallConfig:
        args = build_parser().parse_args(argv)
        return StallConfig(**{**vars(args), "images": tuple(args.images), "caps": tuple(args.caps)})

    return run_subcommand(PROG, config, "dmae_fast.bench.stall:run_stall")
