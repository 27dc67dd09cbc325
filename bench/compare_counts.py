"""Compare two dmae-certify results files row by row, ignoring the time column.

    python -m dmae_fast.bench.compare_counts A.tsv B.tsv [--informational]

Prints "identical: N rows" (exit 0) or each differing row (exit 1; exit 0 with
--informational, e.g. against an older run whose classifier may have changed since).
Used by bench/gpu_session.sh to check that a GPU fp32 run's counts equal the CPU's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dmae_fast.base.command import Parser, run_reporting_errors
from dmae_fast.base.errors import UserError

PROG = "compare_counts"


def _rows(path: Path) -> list[list[str]]:
    """Header and rows without the 'time' column (it differs between runs by nature)."""
    if not path.is_file():
        raise UserError(f"{path} {'is not a file' if path.exists() else 'does not exist'}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a dmae-certify results file (not UTF-8 text)") from None
    lines = [line.split("\t") for line in text.splitlines() if line]
    if not lines or "time" not in lines[0]:
        raise UserError(f"{path} is not a dmae-certify results file (no header with a time column)")
    drop = lines[0].index("time")
    return [row[:drop] + row[drop + 1:] for row in lines]


def compare(a: Path, b: Path, informational: bool = False) -> int:
    rows_a, rows_b = _rows(a), _rows(b)
    if rows_a[0] != rows_b[0]:
        raise UserError(f"{a} and {b} have different columns")
    differing = [(x, y) for x, y in zip(rows_a[1:], rows_b[1:]) if x != y]
    if len(rows_a) != len(rows_b):
        print(f"{PROG}: {a} has {len(rows_a) - 1} rows, {b} has {len(rows_b) - 1}")
    for x, y in differing:
        print(f"{PROG}: differs:\n  {' '.join(x)}\n  {' '.join(y)}")
    if differing or len(rows_a) != len(rows_b):
        return 0 if informational else 1
    print(f"{PROG}: identical: {len(rows_a) - 1} rows ({a} vs {b}, time column ignored)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description="Compare two dmae-certify results files, ignoring the time column.")
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--informational", action="store_true", help="report differences but exit 0")

    def body() -> int:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        return compare(args.a, args.b, args.informational)

    return run_reporting_errors(PROG, body)


if __name__ == "__main__":
    sys.exit(main())

