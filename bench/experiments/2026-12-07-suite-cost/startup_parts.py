"""What one ``dmae-certify`` process spends before it certifies: each library's import, and the compiled noise.

    python bench/experiments/2026-12-07-suite-cost/startup_parts.py [--rounds 3]

Each round, in fresh processes: (1) the imports in the order a certifying process meets them, each timed on its
own (torch, then torchvision, then timm's ViT, then the run driver and the command); (2) a one-image demo run
(n0 10, n 100, the plain body) with ``--noise compiled`` (the default) and with ``--noise reference``, interleaved,
wall and CPU seconds of the child. Nothing about the rows: both noises are the contract's (docs/certify.md).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORTS = """
import time
t0 = time.perf_counter(); import torch
t1 = time.perf_counter(); import torchvision
t2 = time.perf_counter(); import timm.models.vision_transformer
t3 = time.perf_counter(); import dmae_fast.run.driver, dmae_fast.cli.certify
t4 = time.perf_counter()
print(f"torch {t1 - t0:.2f}  torchvision {t2 - t1:.2f}  timm {t3 - t2:.2f}  dmae_fast {t4 - t3:.2f}")
"""


def timed_run(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + sys) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    script = str(Path(sys.executable).with_name("dmae-certify"))
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            imports = subprocess.run([sys.executable, "-c", IMPORTS], check=True, capture_output=True, text=True)
            print(f"round {round_ + 1} imports: {imports.stdout.strip()}")
            for noise in ("compiled", "reference"):
                out = Path(folder) / f"{noise}-{round_}.tsv"
                wall, cpu = timed_run([script, "--data", "demo", "--max", "1", "--n0", "10", "--n", "100", "--body",
                                       "plain", "--noise", noise, "--quiet", "--out", str(out)])
                print(f"round {round_ + 1} one-image run, --noise {noise}: {wall:.2f} s wall, {cpu:.2f} CPU s")


if __name__ == "__main__":
    main()
