"""The demo table of run.sh: samples per image and certified accuracy at the paper's grid radii.

    python bench/experiments/2026-11-26-sequential-demo/table.py DIR > DIR/demo-table.md
"""

import sys
from pathlib import Path

import numpy as np

from dmae_fast.results.format import read_results

GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)
RUNS = (("fixed-10k", "fixed-n, n 10,000"), ("fixed-100k", "fixed-n, n 100,000"),
        ("bonferroni-10k", "--sequential-test bonferroni, cap 10,000"),
        ("exact-10k", "--sequential (exact), cap 10,000"), ("exact-100k", "--sequential (exact), cap 100,000"))


def main() -> None:
    out = Path(sys.argv[1])
    print("| sigma | procedure | samples / image | vs fixed-n 10,000 | "
          + " | ".join(f"r = {r:g}" for r in GRID) + " |")
    print("| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in GRID) + " |")
    for sigma in ("0.25", "0.5"):
        base = None
        for stem, label in RUNS:
            path = out / f"{stem}-s{sigma}.tsv"
            if not path.exists():
                continue
            table = read_results(path)
            samples = float(np.mean(table.extra["n0"].astype(float) + table.extra["n"].astype(float)))
            base = base or samples
            correct = table.correct.astype(bool)
            accuracy = [100.0 * np.mean(correct & (table.radius >= r) & (table.predict >= 0)) for r in GRID]
            print(f"| {sigma} | {label} | {samples:,.0f} | {base / samples:.2f}x | "
                  + " | ".join(f"{a:.0f}" for a in accuracy) + " |")


if __name__ == "__main__":
    main()
