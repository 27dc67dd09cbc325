"""``dmae-sound-table``: write the exact thresholds of ``--sound``'s noise for the C++ library
(``dmae-smooth certify --sound FILE``), in :mod:`dmae_fast.stats.sound_table_file`'s format (docs/cpp.md)."""

from __future__ import annotations

import argparse

from dmae_fast.base.command import Parser, run_reporting_errors
from dmae_fast.base.errors import UserError
from dmae_fast.stats.rounded_gaussian import MAX_STEPS, sound_table, table_problem
from dmae_fast.stats.sound_table_file import write_sound_table

PROG = "dmae-sound-table"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Compute the exact integer thresholds of --sound's rounded Gaussian "
                    "noise (mpmath, checked at two precisions) and write them as a .npy file for dmae-smooth --sound.")
    parser.add_argument("--sigma", type=float, required=True, help="noise level in [0, 1] pixel units "
                        f"(--grid times --sigma at most {MAX_STEPS})")
    parser.add_argument("--grid", type=int, default=255,
                        help="grid levels L: inputs are k/L (255: 8-bit images; 16: the demo digits)")
    parser.add_argument("--out", required=True, help="the .npy file to write (an existing one is refused; "
                        "it appears only once complete)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out (a regular file only)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``dmae-sound-table``; returns the exit status (2 for bad input)."""
    return run_reporting_errors(PROG, lambda: _write(build_parser().parse_args(argv)))


def _write(args: argparse.Namespace) -> int:
    problem = table_problem(args.sigma, args.grid)  # before any work: a table too large to build is refused at once
    if problem is not None:
        raise UserError(problem)
    table = sound_table(args.sigma, args.grid)
    write_sound_table(table, args.out, args.overwrite)
    print(f"{args.out}: sigma {table.sigma!r} on the 1/{table.grid} grid, K = {table.K}, "
          f"total variation per element <= {table.tv_per_element!r}")
    return 0
