#!/usr/bin/env python
"""The paper's DMAE-vs-MAE comparison on the demo digits, with dmae-train and dmae-certify.

Pre-training with sigma 0.25 (DMAE) and with sigma 0 (MAE: same masking, same loss over
all patches, no noise), each followed by linear probing and by fine-tuning with
consistency regularization at sigma 0.25, then CERTIFY on every ``--skip``-th test digit.
Runs already present in WORK are reused (e.g. the demo model's own runs), so
``scripts/build_demo_model.sh WORK/dmae`` followed by this script costs one extra
pre-training. Writes WORK/dmae-vs-mae.md (and prints it).

    python scripts/dmae_vs_mae.py --work runs/compare [--skip 10] [--n 10000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dmae_fast.analysis import format_table
from dmae_fast.cli import certify, train
from dmae_fast.results.format import read_results

RADII = (0.0, 0.25, 0.5, 0.75)
PRETRAIN = {"dmae": ["--set", "sigma=0.25"], "mae": ["--set", "sigma=0"]}


def step(args: list[str], result: Path) -> None:
    """Run one command unless its result already exists."""
    if result.exists():
        print(f"reusing {result}")
        return
    started = time.perf_counter()
    if (train.main(args) if args[0] in train.TRAINING else certify.main(args)) != 0:
        sys.exit(f"failed: {' '.join(args)}")
    print(f"{result} in {time.perf_counter() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/compare"))
    parser.add_argument("--skip", type=int, default=10, help="certify every k-th of the 500 test digits")
    parser.add_argument("--n", type=int, default=10_000, help="CERTIFY's estimation samples (n0 = 100)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="extra dmae-train overrides for the pre-training runs (e.g. optim.epochs=100)")
    args = parser.parse_args()
    extra = [x for item in args.overrides for x in ("--set", item)]
    tables, labels = [], []
    for name, sigma in PRETRAIN.items():
        run = args.work / name
        pretrained = run / "pretrain" / "pretrain.pth"
        step(["pretrain", "--preset", "demo-pretrain", *sigma, *extra, "--out", str(run / "pretrain"), "--quiet"],
             pretrained)
        for kind in ("linprobe", "finetune"):
            classifier = run / kind / "classifier.safetensors"
            step([kind, "--preset", f"demo-{kind}", "--init", str(pretrained), "--out", str(run / kind), "--quiet"],
                 classifier)
            results = run / f"certify-{kind}.tsv"
            step(["--ckpt", str(classifier), "--data", "demo", "--skip", str(args.skip), "--n0", "100",
                  "--n", str(args.n), "--device", "cpu", "--quiet", "--out", str(results)], results)
            tables.append(read_results(results))
            labels.append(f"{name.upper()} + {'linear probe' if kind == 'linprobe' else 'fine-tune (CR)'}")
    table = format_table(tables, RADII, "markdown", labels)
    report = args.work / "dmae-vs-mae.md"
    report.write_text(f"Certified accuracy (%) on every {args.skip}th demo test digit, sigma 0.25, "
                      f"n0 100, n {args.n}, alpha 0.001\n\n{table}\n")
    print(report.read_text())


if __name__ == "__main__":
    main()
