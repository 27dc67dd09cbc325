"""Steady-state CERTIFY speed on the demo (3 digits, n0 100, n 10,000, 2 threads): Cohen et al.'s
loop, our plain body and our fast body, interleaved 3 rounds; medians and ratios to Cohen as JSON.
Run once per code version (before / after a refactor), alternating, to compare the ratios.

    python bench/experiments/2026-11-26-refactor-identity/speed.py OUT.json
"""

import json
import statistics
import sys

import torch

from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.bench.cpu import SEED, SIGMA, WORKLOADS, Workload, ours_run, reference_run, timed
from dmae_fast.bench.reference_loops import COHEN
from dmae_fast.bench.throughput import build_model
from dmae_fast.data import demo_digits
from dmae_fast.engines import TorchEngine


def main() -> None:
    torch.set_num_threads(2)
    load = WORKLOADS["demo"]
    model = build_model("demo", torch.device("cpu"))
    digits = demo_digits("test")
    images = [digits[i][0] for i in range(load.images)]
    engine = TorchEngine(model, torch.device("cpu"), "fp32")

    def methods(images, load: Workload) -> dict:
        return {"cohen": reference_run(COHEN, model, images, load),
                "plain": ours_run(engine, batch_body(engine, SIGMA, SEED, load.batch, BodyOptions()), images, load),
                "fast": ours_run(engine, batch_body(engine, SIGMA, SEED, load.batch, BodyOptions(fast=True, workers=2)),
                                 images, load)}

    for run in methods(images[:1], Workload("demo", 1, 10, 200, load.batch)).values():
        run()  # first touch, export, compile
    runs, seconds = methods(images, load), {}
    for _ in range(3):
        for name, run in runs.items():
            seconds.setdefault(name, []).append(timed(run)[0])
    samples = load.images * (load.n0 + load.n)
    rate = {name: samples / statistics.median(s) for name, s in seconds.items()}
    record = {"seconds": seconds, "samples_per_s": rate,
              "vs_cohen": {name: rate[name] / rate["cohen"] for name in rate}}
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1)
    print(json.dumps(record["vs_cohen"]))


if __name__ == "__main__":
    main()
