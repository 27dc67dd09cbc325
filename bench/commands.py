"""Whole commands, start-up included: what a user waits for, from the shell prompt to the rows.

``dmae-bench cpu --commands 10 100`` times, for each image count, three programs that certify
the first N demo test digits (CERTIFY, n0 100, n 10,000, sigma 0.25, alpha 0.001), each a new
process, interleaved for ``rounds`` rounds (medians kept):

* Cohen et al.'s loop as a program (``python -m dmae_fast.bench.commands cohen``): import torch,
  load the demo classifier and digits, then per image their loop (:mod:`.reference_loops`) and
  the Clopper-Pearson bound, one row printed per image;
* ``dmae-certify --data demo --max N --body plain``;
* ``dmae-certify --data demo --max N`` (the default: the fast body, checked on a trial batch).

A first, untimed round warms what every later start finds on disk (Inductor's and the model
cache), as a user's second run would; the cold start is the first run's time, recorded apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

PROGRAMS = ("reference: Cohen et al. (program)", "dmae-certify --body plain", "dmae-certify (fast, default)")
N0, N, SIGMA, ALPHA = 100, 10_000, 0.25, 0.001


@dataclass
class CommandRow:
    images: int
    program: str
    seconds: list[float]
    cold_seconds: float
    median_s: float = 0.0
    vs_cohen: float = 0.0  # Cohen's median time / this one's: > 1 is faster


def argv_for(program: str, images: int, out: str) -> list[str]:
    """The command line of ``program`` on ``images`` demo digits."""
    if program == PROGRAMS[0]:
        return [sys.executable, "-m", "dmae_fast.bench.commands", "cohen", "--images", str(images)]
    body = ["--body", "plain"] if program == PROGRAMS[1] else []
    return [sys.executable, "-m", "dmae_fast.cli.certify", "--data", "demo", "--max", str(images), "--n0", str(N0),
            "--n", str(N), "--sigma", str(SIGMA), "--alpha", str(ALPHA), "--seed", "0", "--quiet", "--overwrite",
            "--out", out, *body]


def _time(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def time_commands(image_counts: tuple[int, ...], rounds: int, progress=None) -> list[CommandRow]:
    """Rows for every (image count, program): a cold run, then ``rounds`` warm interleaved rounds."""
    env = {k: v for k, v in os.environ.items() if k != "DMAE_FAST_BODY"}  # the programs' own defaults
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        env["DMAE_FAST_CACHE"] = os.path.join(folder, "cache")  # cold at first, then warm
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor")
        out = os.path.join(folder, "rows.tsv")
        for images in image_counts:
            for program in PROGRAMS:
                rows[images, program] = CommandRow(images, program, [], _time(argv_for(program, images, out), env))
                if progress is not None:
                    progress.update()
        for _ in range(rounds):
            for images in image_counts:
                for program in PROGRAMS:
                    rows[images, program].seconds.append(_time(argv_for(program, images, out), env))
                    if progress is not None:
                        progress.update()
    for row in rows.values():
        row.median_s = statistics.median(row.seconds)
    for row in rows.values():
        row.vs_cohen = rows[row.images, PROGRAMS[0]].median_s / row.median_s
    return list(rows.values())


def cohen_program(images: int, n0: int = N0, n: int = N) -> None:
    """Cohen et al.'s CERTIFY as a program: their loop per image, one row per image."""
    from dmae_fast.bench.reference_loops import COHEN
    from dmae_fast.data import demo_digits
    from dmae_fast.demo_files import DEMO_CHECKPOINT
    from dmae_fast.model.checkpoints import load_classifier
    from dmae_fast.stats.bounds import lower_confidence_bound, radius

    model = load_classifier(DEMO_CHECKPOINT).eval()
    digits = demo_digits("test")
    print("idx\tlabel\tpredict\tradius\tcorrect")
    for index in range(images):
        image, label = digits[index]
        selection = COHEN.counts(model, image, n0, SIGMA)
        top = int(selection.argmax())
        count = int(COHEN.counts(model, image, n, SIGMA)[top])
        bound = lower_confidence_bound(count, n, ALPHA)
        predicted, certified = (top, radius(bound, SIGMA)) if bound > 0.5 else (-1, 0.0)
        print(f"{index}\t{label}\t{predicted}\t{certified:.4f}\t{int(predicted == label)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Cohen et al.'s CERTIFY loop as a program, on the demo digits")
    parser.add_argument("program", choices=["cohen"])
    parser.add_argument("--images", type=int, default=10)
    parser.add_argument("--n0", type=int, default=N0)
    parser.add_argument("--n", type=int, default=N)
    args = parser.parse_args()
    cohen_program(args.images, args.n0, args.n)


if __name__ == "__main__":
    main()
