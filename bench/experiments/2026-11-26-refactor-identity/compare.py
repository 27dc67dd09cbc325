"""Compare two record.sh folders: every TSV column but time, every answer field but versions and timing.

    python bench/experiments/2026-11-26-refactor-identity/compare.py BEFORE AFTER
"""

import csv
import json
import sys
from pathlib import Path

IGNORED_COLUMNS = {"time"}
IGNORED_FIELDS = {"dmae_fast", "engine"}  # the receipt's version and body description may change


def rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [{k: v for k, v in row.items() if k not in IGNORED_COLUMNS}
                for row in csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t")]


def scrub(value):
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in IGNORED_FIELDS}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def main() -> int:
    before, after = Path(sys.argv[1]), Path(sys.argv[2])
    same = True
    for tsv in sorted(before.glob("*.tsv")):
        ok = rows(tsv) == rows(after / tsv.name)
        same &= ok
        print(f"{tsv.name}: {'identical' if ok else 'DIFFERENT'} ({len(rows(tsv))} rows)")
    ok = scrub(json.loads((before / "serve.json").read_text())) == scrub(json.loads((after / "serve.json").read_text()))
    same &= ok
    print(f"serve.json: {'identical' if ok else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
