"""Where the --fast workers' time goes on the demo (OpenVINO, 2 workers, batch 1000).

    python bench/experiments/2026-11-25-cpu-fast-openvino/worker_time.py \
        > bench/results/2026-11-25-cpu-fast/openvino/worker_time.txt   # from the repository root

Certifies 6 demo images (100 + 10,000 samples) three times (the first compiles) and splits the
two cores' time into classifying, making noise, and neither (waiting at the end of a batch,
counting, the GIL): the most an asynchronous body that removes the wait could recover.

The body's public ``classifier`` and ``noise`` are wrapped in timers (the recorded run timed
the body's private per-worker noise method, which adds only the worker's
``torch.set_num_threads(1)`` call to the noise source's own time).
"""
import collections
import time

import torch

from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines import TorchEngine
from dmae_fast.model.checkpoints import load_classifier

busy = collections.Counter()


class Timed:
    """Calls ``target``, adding the seconds spent to ``busy[name]``; every other attribute is the target's."""

    def __init__(self, name: str, target) -> None:
        self.name, self.target = name, target

    def __call__(self, *args):
        start = time.perf_counter()
        result = self.target(*args)
        busy[self.name] += time.perf_counter() - start
        return result

    def __getattr__(self, attribute: str):
        return getattr(self.target, attribute)


def main() -> None:
    torch.set_num_threads(2)
    model = load_classifier(DEMO_CHECKPOINT).eval()
    engine = TorchEngine(model, torch.device("cpu"), "fp32")
    digits = demo_digits("test")
    items = [(i, digits[i][0], 0) for i in range(6)]
    body = batch_body(engine, 0.25, 0, 1000, BodyOptions(fast=True))  # applies keep_freed_memory too
    body.classifier.classify = Timed("classify", body.classifier.classify)
    body.noise = Timed("noise", body.noise)
    print(body.description)
    for _ in range(3):
        busy.clear()
        start = time.perf_counter()
        list(StreamingCertifier(engine, SamplingPlan.certify(100, 10_000), 0.25, 0, 1000, body).run(items))
        wall = time.perf_counter() - start
        cores = 2 * wall
        print(f"{len(items) * 10_100 / wall:8,.0f} samples/s  classify {busy['classify'] / cores:.1%}  "
              f"noise {busy['noise'] / cores:.1%}  neither {(cores - busy['classify'] - busy['noise']) / cores:.1%}")


if __name__ == "__main__":
    main()
