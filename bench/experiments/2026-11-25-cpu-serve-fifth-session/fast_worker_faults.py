"""Minor page faults of the --fast CPU workers, with glibc's thresholds only or with one arena as well.

Record of the fifth 2026-11-25 session (serving, the same allocator setting for the --fast
workers); run from the repository root, one process per measurement:

    python bench/experiments/2026-11-25-cpu-serve-fifth-session/fast_worker_faults.py old small-224
    python bench/experiments/2026-11-25-cpu-serve-fifth-session/fast_worker_faults.py new small-224   # and demo

``old``: the mmap and trim thresholds at 1 GiB but glibc's default arenas (the setting before
``M_ARENA_MAX`` joined ``dmae_fast.base.memory``); ``new``: what ``keep_freed_memory`` does now. The
recorded run patched a constant of ``dmae_fast.base.memory``; this script instead restarts itself with
glibc's own ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` set for ``old`` (the same
thresholds, applied by glibc at start; ``keep_freed_memory`` then leaves the allocator alone) and
with none of the variables for ``new``. Quoted in
bench/results/2026-11-25-cpu-serve/fifth-session/README.md.
"""
import os
import resource
import sys
import time

from dmae_fast.base.memory import KEEP_BELOW, USER_SETTINGS


def allocator_environment(mode: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in USER_SETTINGS}
    if mode == "old":
        env["MALLOC_MMAP_THRESHOLD_"] = env["MALLOC_TRIM_THRESHOLD_"] = str(KEEP_BELOW)
    return env


def main(mode: str, name: str) -> None:
    env = allocator_environment(mode)
    if any(os.environ.get(key) != env.get(key) for key in USER_SETTINGS):  # glibc reads them at start only
        os.execve(sys.executable, [sys.executable, __file__, mode, name], env)
    import torch

    from dmae_fast.base.memory import keep_freed_memory
    from dmae_fast.batching.bodies import BodyOptions, batch_body
    from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
    from dmae_fast.bench.throughput import build_model
    from dmae_fast.engines import TorchEngine

    torch.set_num_threads(2)
    model = build_model(name, torch.device("cpu"))
    engine = TorchEngine(model, torch.device("cpu"), "fp32")
    batch = 100 if name == "small-224" else 1000
    body = batch_body(engine, 0.25, 0, batch, BodyOptions(fast=True, workers=2))
    n = 1000 if name == "small-224" else 10000
    images = [torch.rand(model.spec.input_shape) for _ in range(2)]

    def run():
        certifier = StreamingCertifier(engine, SamplingPlan.predict(n), 0.25, 0, batch, body)
        return list(certifier.run([(i, im, 0) for i, im in enumerate(images)]))

    run()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    run()
    dt = time.perf_counter() - t
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    print(mode, name, keep_freed_memory(),
          f"{(f1 - f0) / (2 * n / 1000):,.0f} faults per 1000 samples, {2 * n / dt:,.0f} samples/s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
