"""``dmae-bench serve``: dmae-serve's saturation throughput against the offline streamer, and its
latency at 25/50/90% of saturation, for several --max-wait-ms values (loopback, one run)."""

from __future__ import annotations

import argparse

from dmae_fast.base.command import Parser
from dmae_fast.bench.command import run_subcommand
from dmae_fast.bench.config import ServeBenchConfig

PROG = "dmae-bench serve"


def build_parser() -> argparse.ArgumentParser:
    defaults = ServeBenchConfig()
    parser = Parser(prog=PROG, description="Start dmae-serve on 127.0.0.1 once per --max-wait-ms value; measure its "
                    "saturation samples/s against the offline streamer's in the same run, and p50/p99 latency at "
                    "fractions of saturation (Poisson arrivals); writes serve-bench.json/.md in --out")
    parser.add_argument("--out", default=defaults.out, help=f"output directory (default {defaults.out})")
    parser.add_argument("--ckpt", default=defaults.ckpt, help="classifier (default: the demo model)")
    parser.add_argument("--device", default=defaults.device, help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--batch", type=int, default=defaults.batch, help=f"default {defaults.batch}")
    parser.add_argument("--n", type=int, default=defaults.n, help=f"PREDICT samples per request (default {defaults.n})")
    parser.add_argument("--max-wait-ms", type=float, nargs="+", dest="max_waits_ms",
                        default=list(defaults.max_waits_ms), help="values swept (default 0 5 20 50)")
    parser.add_argument("--loads", type=float, nargs="+", default=list(defaults.loads),
                        help="fractions of saturation for the latency (default 0.25 0.5 0.9)")
    parser.add_argument("--clients", type=int, default=defaults.clients, help="closed-loop clients at saturation")
    parser.add_argument("--rounds", type=int, default=defaults.rounds, help="interleaved saturation rounds "
                        f"(default {defaults.rounds})")
    parser.add_argument("--saturation-seconds", dest="saturation_s", type=float, default=defaults.saturation_s,
                        help=f"seconds per saturation round (default {defaults.saturation_s:g})")
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="seconds per latency measurement")
    parser.add_argument("--fast", action="store_true", help="the --fast batch body, offline and in the server")
    parser.add_argument("--quick", action="store_true", help="seconds per step: checks the setup, measures nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    def config() -> ServeBenchConfig:
        args = build_parser().parse_args(argv)
        return ServeBenchConfig(**{**vars(args), "max_waits_ms": tuple(args.max_waits_ms), "loads": tuple(args.loads)})

    return run_subcommand(PROG, config, "dmae_fast.bench.serve:run_serve_bench")
