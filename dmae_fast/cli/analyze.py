"""``dmae-certify analyze``: certified-accuracy tables and plots from results files."""

from __future__ import annotations

import argparse
import math
import sys

from dmae_fast.analysis import (
    DEFAULT_RADII,
    check_rows,
    format_table,
    plot_certified_accuracy,
    reachable_radii,
    recorded_cap,
    rounding_warning,
)
from dmae_fast.base.command import Parser, run_reporting_errors
from dmae_fast.base.errors import UserError
from dmae_fast.results.format import read_results

PROG = "dmae-certify analyze"


def _radius(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"radius must be a finite number >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Summarize randomized-smoothing results files (ours or those of Cohen "
                    "et al.'s certify.py / predict.py): certified accuracy in percent at each radius and the average "
                    "certified radius (ACR) for certification files, clean accuracy and abstain rate for prediction "
                    "files.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="tab-separated results file(s) written by "
                        "dmae-certify or by the reference implementation")
    parser.add_argument("--radii", nargs="+", type=_radius, metavar="R", default=list(DEFAULT_RADII),
                        help="l2 radii at which to report certified accuracy (default: 0 to 3 in steps of 0.25)")
    parser.add_argument("--plot", metavar="OUT", help="also write a certified-accuracy-vs-radius plot to OUT "
                        "(.png or .pdf; the directory must exist; an existing file is replaced)")
    style = parser.add_mutually_exclusive_group()
    style.add_argument("--markdown", action="store_true", help="print a Markdown table")
    style.add_argument("--latex", action="store_true", help="print a LaTeX tabular (uses the booktabs rules)")
    parser.add_argument("--labels", nargs="+", metavar="NAME", help="row and legend names, one per FILE (default: "
                        "file names without directory and extension)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``dmae-certify analyze``; returns the exit status (2 for bad input)."""
    return run_reporting_errors(PROG, lambda: _analyze(build_parser().parse_args(argv)))


def _analyze(args: argparse.Namespace) -> int:
    if args.labels is not None and len(args.labels) != len(args.files):
        raise UserError(f"--labels got {len(args.labels)} names for {len(args.files)} files")
    tables = [read_results(path) for path in args.files]
    unchecked = [check_rows(t) for t in tables]  # a row its run cannot have written refuses the file
    style = "markdown" if args.markdown else "latex" if args.latex else "text"
    caps = [recorded_cap(t) for t in tables if t.kind == "certify"]
    cap = max(caps) if caps and None not in caps else None  # a radius any of the runs could reach stays
    radii, note = reachable_radii(args.radii, cap)
    table = format_table(tables, radii, style=style, labels=args.labels)
    if args.plot is not None:
        for t in tables:
            if t.kind != "certify":
                raise UserError(f"--plot needs certification files; {t.path} is a prediction file")
        plot_certified_accuracy(tables, args.plot, labels=args.labels)
    for warning in filter(None, [*unchecked, *map(rounding_warning, tables)]):
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    print(table)
    if note:
        print(note)
    if args.plot is not None:
        print(f"{PROG}: wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
