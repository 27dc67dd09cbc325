"""glibc's default thresholds against keeping freed memory (dmae_fast.base.memory), per method.

Record of the fourth 2026-11-25 session (issue 12); run from the repository root:

    python bench/experiments/2026-11-25-cpu-fast-allocator/ab.py > bench/results/2026-11-25-cpu-fast/allocator/ab.txt

The allocator is set at process start, so every measurement is its own process: for each model,
thread count and method, a process with glibc's defaults and one that keeps freed memory run
back to back (A/B adjacent, so that a change in the machine's load hits both); each certifies
the same images (CERTIFY, n0 100) three times after a warm-up and reports the median samples/s.

The defaults' process gets ``MALLOC_ARENA_MAX`` set to glibc's own default (8 arenas a core on a
64-bit system): glibc's behaviour is unchanged, and ``dmae_fast.base.memory.keep_freed_memory`` leaves
the allocator alone when the user set that variable (public behaviour; the recorded run instead
replaced the function in ``dmae_fast.batching.bodies``). The other process gets none of the
variables. Since the fifth session keeping freed memory also means one arena for every thread, so
a re-run measures that setting, not the fourth session's thresholds alone.
"""

import os
import subprocess
import sys
import time

from dmae_fast.base.memory import USER_SETTINGS

CHILD = r'''
import statistics, sys, time
mode, method, threads, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.base.memory import keep_freed_memory
allocator = keep_freed_memory()  # "as set by MALLOC_ARENA_MAX" (nothing changed) in the defaults' process
assert ("as set by" in allocator) == (mode == "default"), allocator
import torch
from dmae_fast.bench.cpu import WORKLOADS
from dmae_fast.bench.reference_loops import COHEN
from dmae_fast.bench.throughput import build_model
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.data import demo_digits
from dmae_fast.engines import TorchEngine
torch.set_num_threads(threads)
load = WORKLOADS[name]
model = build_model(name, torch.device("cpu"))
generator = torch.Generator().manual_seed(1)
images = ([demo_digits("test")[i][0] for i in range(load.images)] if name == "demo"
          else [torch.rand(model.spec.input_shape, generator=generator) for _ in range(load.images)])
if method == "cohen":
    def run():
        for image in images:
            COHEN.counts(model, image, load.n0, 0.25)
            COHEN.counts(model, image, load.n, 0.25)
else:
    engine = TorchEngine(model, torch.device("cpu"), "fp32")
    body = batch_body(engine, 0.25, 0, load.batch, BodyOptions(fast=method == "fast", workers=threads))
    items = [(i, image, 0) for i, image in enumerate(images)]
    def run():
        list(StreamingCertifier(engine, SamplingPlan.certify(load.n0, load.n), 0.25, 0, load.batch, body).run(items))
run()
rates = []
for _ in range(3):
    start = time.perf_counter()
    run()
    rates.append(len(images) * (load.n0 + load.n) / (time.perf_counter() - start))
print(statistics.median(rates))
'''

LABELS = {"cohen": "Cohen et al. loop", "plain": "ours: plain", "fast": "ours: --fast"}


def environment(mode: str) -> dict[str, str]:
    """The child's environment: glibc's defaults (stated explicitly, so that dmae_fast changes nothing) or none set."""
    env = {key: value for key, value in os.environ.items() if key not in USER_SETTINGS}
    if mode == "default":
        env["MALLOC_ARENA_MAX"] = str(8 * (os.cpu_count() or 1))  # glibc's default on 64-bit systems
    return env


def main() -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M')}; samples/s, median of 3 runs per process; A = glibc defaults, "
          "B = keep freed memory (dmae_fast.base.memory)")
    print("| model | threads | method | A: defaults | B: keep | B / A |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in ("demo", "small-224"):
        for threads in (1, 2):
            for method in LABELS:
                rate = {}
                for mode in ("default", "keep"):
                    out = subprocess.run([sys.executable, "-c", CHILD, mode, method, str(threads), name],
                                         capture_output=True, text=True, check=True, env=environment(mode)).stdout
                    rate[mode] = float(out.split()[-1])
                print(f"| {name} | {threads} | {LABELS[method]} | {rate['default']:,.0f} | {rate['keep']:,.0f} | "
                      f"{rate['keep'] / rate['default']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
