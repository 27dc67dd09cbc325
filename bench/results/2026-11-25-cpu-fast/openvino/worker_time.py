"""Where the --fast workers' time goes on the demo (OpenVINO, 2 workers, batch 1000).

    python bench/results/2026-11-25-cpu-fast/openvino/worker_time.py > .../worker_time.txt   # from the repository root

Certifies 6 demo images (100 + 10,000 samples) three times (the first compiles) and splits the
two cores' time into classifying, making noise, and neither (waiting at the end of a batch,
counting, the GIL): the most an asynchronous body that removes the wait could recover.
"""
import collections
import time

import torch

from dmae_fast.certification.bodies import BodyOptions, batch_body
from dmae_fast.certification.stream import SamplingPlan, StreamingCertifier
from dmae_fast.checkpoints import load_classifier
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines import TorchEngine

torch.set_num_threads(2)
model = load_classifier(DEMO_CHECKPOINT).eval()
engine = TorchEngine(model, torch.device("cpu"), "fp32")
digits = demo_digits("test")
items = [(i, digits[i][0], 0) for i in range(6)]
body = batch_body(engine, 0.25, 0, 1000, BodyOptions(fast=True))  # applies keep_freed_memory too
busy = collections.Counter()


def timed(name, function):
    def wrapper(*args):
        start = time.perf_counter()
        result = function(*args)
        busy[name] += time.perf_counter() - start
        return result
    return wrapper


body.classifier.classify = timed("classify", body.classifier.classify)
body._noisy_on_worker = timed("noise", body._noisy_on_worker)
print(body.description)
for _ in range(3):
    busy.clear()
    start = time.perf_counter()
    list(StreamingCertifier(engine, SamplingPlan.certify(100, 10_000), 0.25, 0, 1000, body).run(items))
    wall = time.perf_counter() - start
    cores = 2 * wall
    print(f"{len(items) * 10_100 / wall:8,.0f} samples/s  classify {busy['classify'] / cores:.1%}  "
          f"noise {busy['noise'] / cores:.1%}  neither {(cores - busy['classify'] - busy['noise']) / cores:.1%}")
