"""Patch rows instead of images into the CPU fast path's classifier: what it changed.

Record of the ninth 2026-11-25 session (issue 12); run from the repository root:

    python bench/experiments/2026-11-25-cpu-fast-patch-input/patch_input_record.py \
        > bench/results/2026-11-25-cpu-fast/patch-input/patch_input_record.txt 2>&1

* profile: OpenVINO's per-node counters for dmae-bench's small-224 ViT (4 blocks, width 64,
  196 patches), image graph and patch graph, 125-row chunks, one thread, us per sample;
* graph: the two graphs classifying chunks back to back (16 rows: the --fast chunk of this
  model; 125 rows), one thread, 5 interleaved rounds;
* noise: the compiled noise kernel (one thread, 16 rows) writing images and writing patch rows;
* ceiling: what two perfectly parallel workers could reach from those one-thread rates
  (classify 16 rows + make their noise, nothing else), against Cohen et al.'s loop (2 threads);
* body: Cohen et al.'s loop (2 threads) and the --fast body (2 workers) certifying with image
  input and with patch input, per runtime, 6 interleaved rounds; small-224 (1 image, 100 +
  2,000 samples) and small-32 (2 images, 100 + 2,000), batch 1000; counts compared with the
  plain body's.

Cohen et al.'s loop and our bodies are timed as ``dmae-bench cpu`` times them (its public
``reference_run``, ``ours_run`` and ``timed``).
"""
import collections
import statistics
import time
import warnings

import numpy as np
import openvino as ov
import torch

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.bench.cpu import CPU, Workload, ours_run, reference_run, timed
from dmae_fast.bench.reference_loops import COHEN
from dmae_fast.bench.throughput import build_model
from dmae_fast.engines import TorchEngine
from dmae_fast.engines.cpu_graphs import onnx_bytes
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.noise.patch_layout import PatchLayout

ROWS = 125
ONE_THREAD = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32",
              "ENABLE_CPU_PINNING": False}
core = None  # the OpenVINO Core, made by main


def interleaved(methods: dict, rate, rounds=5) -> dict:
    rates = {name: [] for name in methods}
    for _ in range(rounds):
        for name, method in methods.items():
            rates[name].append(rate(method))
    base = statistics.median(next(iter(rates.values())))
    for name, values in rates.items():
        print(f"  {name:34s} {statistics.median(values):9,.0f}  {statistics.median(values) / base:.3f}x  "
              f"rounds {[round(v) for v in values]}")
    return rates


def requests(model, layout, rows=ROWS):
    """One-thread OpenVINO infer requests (image graph, patch graph) for ``rows`` rows, and their inputs."""
    images = torch.rand((rows, *model.spec.input_shape), generator=torch.Generator().manual_seed(0))
    out = {}
    for name, lay, x in (("image graph", None, images), ("patch graph", layout, layout.inputs(images))):
        graph = core.read_model(onnx_bytes(model, lay))
        graph.reshape({0: ov.PartialShape(list(x.shape))})
        out[name] = core.compile_model(graph, "CPU", {**ONE_THREAD, "PERF_COUNT": True}).create_infer_request(), \
            x.numpy()
    with torch.inference_mode():
        want = model(images).numpy()
    for name, (request, x) in out.items():
        print(f"  {name}: max |logit - PyTorch| {np.abs(request.infer([x])[0] - want).max():.2g}")
    return out


def profile(graphs) -> None:
    print("profile: OpenVINO counters, small-224, 125-row chunks, 1 thread, us per sample")
    for name, (request, x) in graphs.items():
        for _ in range(5):
            request.infer([x])
        by_kind, calls = collections.Counter(), 20
        for _ in range(calls):
            request.infer([x])
            for node in request.profiling_info:
                if node.status == node.Status.EXECUTED:
                    by_kind[(node.node_type, node.exec_type)] += node.real_time.total_seconds()
        scale = 1e6 / calls / ROWS
        print(f"  {name}: total {sum(by_kind.values()) * scale:.0f}")
        for (kind, kernel), seconds in by_kind.most_common():
            if seconds * scale >= 1:
                print(f"    {kind:16s} {kernel:22s} {seconds * scale:7.1f}")


def graph_rates(graphs, rows) -> dict:
    print(f"graph: samples/s classifying {rows}-row chunks, 1 thread")

    def rate(entry, seconds=1.5):
        request, x = entry
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            request.infer([x])
            calls += 1
        return calls * rows / (time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in interleaved(graphs, rate).items()}


def noise_rates(model, layout) -> dict:
    print("noise: million Gaussians/s, compiled kernel, 1 thread, 16 rows a call")
    torch.set_num_threads(1)
    rows = 16
    images = torch.rand((4, *model.spec.input_shape))
    slot, image = torch.arange(rows) % 4, torch.arange(rows) % 4
    phase, sample = torch.ones(rows, dtype=torch.int64), torch.arange(rows)
    sources = {"images": (NoiseSource(CPU, serial=True), images),
               "patch rows (normalized)": (NoiseSource(CPU, serial=True, layout=layout), layout.arrange(images))}
    with torch.inference_mode():
        for source, clean in sources.values():
            source(clean, slot, 0.25, 0, image, phase, sample)
            assert source.implementation == "compiled"

    def rate(entry, seconds=1.0):
        source, clean = entry
        calls, start = 0, time.perf_counter()
        with torch.inference_mode():
            while time.perf_counter() - start < seconds:
                source(clean, slot, 0.25, 0, image, phase, sample)
                calls += 1
        return calls * rows * images[0].numel() / (time.perf_counter() - start) / 1e6
    return {name: statistics.median(values) for name, values in interleaved(sources, rate).items()}


def bodies(name: str, load: Workload) -> None:
    print(f"body: {name}, 2 workers, {load.images} image(s) x ({load.n0} + {load.n}), batch {load.batch}; samples/s")
    torch.set_num_threads(2)
    model = build_model(name, CPU)
    generator = torch.Generator().manual_seed(1)
    images = [torch.rand(model.spec.input_shape, generator=generator) for _ in range(load.images)]
    engine = TorchEngine(model, CPU, "fp32")
    made = {"plain (compiled noise)": batch_body(engine, 0.25, 0, load.batch, BodyOptions())}
    cohen = reference_run(COHEN, model, images, load)
    for runtime in ("openvino", "onnxruntime"):
        for patch_input in (False, True):
            made[f"{runtime}, {'patch rows' if patch_input else 'images'}"] = batch_body(
                engine, 0.25, 0, load.batch, BodyOptions(fast=True, workers=2, cpu_runtime=runtime,
                                                         patch_input=patch_input))
    runs = {"Cohen et al.'s loop (2 threads)": cohen, **{key: ours_run(engine, body, images, load)
                                                         for key, body in made.items()}}
    warm = Workload(name, 1, load.n0, 2 * load.batch, load.batch)  # compile, first-touch, every chunk size
    for body in made.values():
        ours_run(engine, body, images[:1], warm)()
    counts = {}

    def rate(key):
        seconds, counts[key] = timed(runs[key])
        return load.images * (load.n0 + load.n) / seconds
    interleaved({key: key for key in runs}, rate, rounds=6)
    plain = counts.pop("plain (compiled noise)")
    counts.pop("Cohen et al.'s loop (2 threads)")
    print(f"  counts equal the plain body's: {all(np.array_equal(c, plain) for c in counts.values())}")


def main() -> None:
    global core
    keep_freed_memory()
    warnings.simplefilter("ignore")
    core = ov.Core()
    print(f"torch {torch.__version__}, OpenVINO {ov.__version__}")
    torch.set_num_threads(1)
    small = build_model("small-224", CPU)
    layout = PatchLayout.of(small)
    profile(requests(small, layout))
    graph_rates(requests(small, layout), ROWS)
    graph = graph_rates(requests(small, layout, 16), 16)
    noise = noise_rates(small, layout)
    per_sample = {name: 1 / graph[f"{name} graph"] + 3 * 224 * 224 / (noise[kind] * 1e6)
                  for name, kind in (("image", "images"), ("patch", "patch rows (normalized)"))}
    print("ceiling: two workers doing nothing but classify 16-row chunks and make their noise, samples/s")
    for name, seconds in per_sample.items():
        print(f"  {name} input: {2 / seconds:,.0f} ({seconds * 1e3:.2f} ms per sample per core)")
    bodies("small-224", Workload("small-224", 1, 100, 2_000, 1000))
    bodies("small-32", Workload("small-32", 2, 100, 2_000, 1000))


if __name__ == "__main__":
    main()
