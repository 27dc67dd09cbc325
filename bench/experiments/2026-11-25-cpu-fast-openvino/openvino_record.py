"""OpenVINO as the --fast chunk classifier: where its time goes and what the choices gained.

Record of the eighth 2026-11-25 session (issue 12); run from the repository root:

    python bench/experiments/2026-11-25-cpu-fast-openvino/openvino_record.py shapes variants profile pipeline \
        > bench/results/2026-11-25-cpu-fast/openvino/openvino_record.txt 2>&1

* shapes: the demo graph compiled for exactly 125 rows, for 1-128 rows, and for any rows (one
  thread), classifying 125-row chunks back to back: 1.5 s per method, 5 interleaved rounds, medians.
* variants: the exported graph as timm writes the model, with q/k/v split before their
  transposes, and with the pooled tail (dmae_fast.engines.graphs), on OpenVINO, one thread.
* profile: OpenVINO's per-node counters for the demo graph (chunks of 125, one thread).
* pipeline: two workers; A: classify a fixed chunk back to back; B: make each chunk's noise, then
  classify it; C: the whole --fast body certifying 6 images (100 + 10,000 samples), per runtime.
"""
import collections
import io
import statistics
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openvino as ov
import torch
import torch.nn.functional as F

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines import TorchEngine
from dmae_fast.engines.cpu_graphs import onnx_bytes
from dmae_fast.engines.graphs import ImageGraph
from dmae_fast.model.checkpoints import load_classifier

ROWS = 125  # the chunk of a 1000-row batch on 2 workers
ONE_THREAD = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}
model = core = chunk = WANT = None  # set by setup(), which main runs first


def setup() -> None:
    global model, core, chunk, WANT
    keep_freed_memory()
    warnings.simplefilter("ignore")
    model = load_classifier(DEMO_CHECKPOINT).eval()
    core = ov.Core()
    chunk = torch.rand((ROWS, 3, 8, 8), generator=torch.Generator().manual_seed(0))
    chunk = chunk + 0.25 * torch.randn(chunk.shape, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        WANT = model(chunk)


def compiled(graph_bytes: bytes, rows, config=ONE_THREAD):
    graph = core.read_model(graph_bytes)
    if rows is not None:
        graph.reshape({0: ov.PartialShape([rows, 3, 8, 8])})
    return core.compile_model(graph, "CPU", config)


def rate(infer, seconds=1.5) -> float:
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        infer()
        calls += 1
    return calls * ROWS / (time.perf_counter() - start)


def interleaved(methods: dict, rounds=5) -> None:
    rates = {name: [] for name in methods}
    for _ in range(rounds):
        for name, infer in methods.items():
            rates[name].append(rate(infer))
    base = statistics.median(next(iter(rates.values())))
    for name, values in rates.items():
        print(f"  {name:28s} {statistics.median(values):8,.0f} samples/s  {statistics.median(values) / base:.3f}x  "
              f"rounds {[round(v) for v in values]}")


def shapes() -> None:
    print("shapes: one compiled model per chunk size vs one for a range vs one for any size (demo, 1 thread)")
    x = chunk.numpy()
    graph = onnx_bytes(model)
    methods = {}
    for name, rows in (("exactly 125 rows", ROWS), ("1 to 128 rows", ov.Dimension(1, 128)), ("any rows", None)):
        start = time.perf_counter()
        request = compiled(graph, rows).create_infer_request()
        print(f"  {name}: compiled in {time.perf_counter() - start:.2f} s")
        methods[name] = lambda request=request: request.infer([x])
    interleaved(methods)


def _attention(block, h, split):
    attn, (rows, tokens, width) = block.attn, h.shape
    heads = attn.num_heads
    qkv = F.linear(h, attn.qkv.weight, attn.qkv.bias)
    if split:
        q, k, v = (t.reshape(rows, tokens, heads, width // heads).transpose(1, 2) for t in qkv.split(width, dim=-1))
    else:
        q, k, v = qkv.reshape(rows, tokens, 3, heads, width // heads).permute(2, 0, 3, 1, 4).unbind(0)
    o = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1) @ v
    return F.linear(o.transpose(1, 2).reshape(rows, tokens, width), attn.proj.weight, attn.proj.bias)


class SplitQkv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.vit = model

    def forward(self, x):
        t = self.vit.tokens(x)
        for block in self.vit.blocks:
            t = t + _attention(block, block.norm1(t), split=True)
            t = t + block.mlp(block.norm2(t))
        return self.vit.forward_head(self.vit.norm(t))


def _onnx(module) -> bytes:
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module.eval(), (chunk[:2],), buffer, input_names=["images"], output_names=["logits"],
                          dynamic_axes={"images": {0: "batch"}}, opset_version=17, dynamo=False)
    return buffer.getvalue()


def variants() -> None:
    print("variants: the exported graph on OpenVINO (demo, 1 thread, compiled for 125 rows)")
    x = chunk.numpy()
    methods = {}
    for name, module in (("timm's forward", ImageGraph(model)), ("q/k/v split", SplitQkv()),
                         ("pooled tail (kept)", ImageGraph(model, pooled_tail=True))):
        request = compiled(_onnx(module), ROWS).create_infer_request()
        print(f"  {name}: max |logit - PyTorch| {np.abs(request.infer([x])[0] - WANT.numpy()).max():.2g}")
        methods[name] = lambda request=request: request.infer([x])
    interleaved(methods)


def profile() -> None:
    print("profile: OpenVINO's counters, demo graph as --fast exports it, 125-row chunks, 1 thread, us per sample")
    request = core.compile_model(_reshaped(onnx_bytes(model)), "CPU", {**ONE_THREAD, "PERF_COUNT": True}) \
        .create_infer_request()
    x = chunk.numpy()
    for _ in range(200):
        request.infer([x])
    by_kind, by_node = collections.Counter(), collections.Counter()
    calls = 300
    for _ in range(calls):
        request.infer([x])
        for node in request.profiling_info:
            if node.status == node.Status.EXECUTED:
                seconds = node.real_time.total_seconds()
                by_kind[(node.node_type, node.exec_type)] += seconds
                by_node[(node.node_name, node.node_type, node.exec_type)] += seconds
    scale = 1e6 / calls / ROWS
    print(f"  total {sum(by_kind.values()) * scale:.1f} us per sample")
    for (kind, kernel), seconds in by_kind.most_common():
        print(f"  {kind:16s} {kernel:22s} {seconds * scale:7.2f}")
    print("  per node (block 0 and the last block):")
    for (name, kind, kernel), seconds in sorted(by_node.items(), key=lambda item: -item[1]):
        if "blocks.0/" in name or "blocks.3/" in name:
            print(f"  {seconds * scale:6.2f}  {kind:15s} {kernel:20s} {name}")


def _reshaped(graph_bytes: bytes):
    graph = core.read_model(graph_bytes)
    graph.reshape({0: ov.PartialShape([ROWS, 3, 8, 8])})
    return graph


def pipeline() -> None:
    print("pipeline: 2 workers; A classify only, B noise + classify, C the --fast body (6 demo images)")
    torch.set_num_threads(2)
    engine = TorchEngine(model, torch.device("cpu"), "fp32")
    digits = demo_digits("test")
    items = [(i, digits[i][0], 0) for i in range(6)]
    pool = ThreadPoolExecutor(2)
    slots, index = torch.rand(4, 3, 8, 8), torch.zeros(ROWS, dtype=torch.int64)
    phase = torch.ones(ROWS, dtype=torch.int64)
    for runtime in ("openvino", "onnxruntime"):
        body = batch_body(engine, 0.25, 0, 1000, BodyOptions(fast=True, cpu_runtime=runtime))
        classifier = body.classifier

        def classify_only(stop):
            torch.set_num_threads(1)
            calls = 0
            while time.perf_counter() < stop:
                classifier.classify(chunk)
                calls += 1
            return calls * ROWS

        def noise_and_classify(stop):
            torch.set_num_threads(1)
            calls = 0
            while time.perf_counter() < stop:
                sample = torch.arange(calls * ROWS, (calls + 1) * ROWS)
                classifier.classify(body.noise(slots, index, 0.25, 0, index, phase, sample))
                calls += 1
            return calls * ROWS

        def two_workers(loop):
            start = time.perf_counter()
            return sum(pool.map(loop, [start + 3] * 2)) / (time.perf_counter() - start)

        def whole_body():
            start = time.perf_counter()
            list(StreamingCertifier(engine, SamplingPlan.certify(100, 10_000), 0.25, 0, 1000, body).run(items))
            return len(items) * 10_100 / (time.perf_counter() - start)

        runs = {"A classify only": lambda: two_workers(classify_only),
                "B noise + classify": lambda: two_workers(noise_and_classify), "C --fast body": whole_body}
        for run in runs.values():
            run()  # warm
        rates = {name: [] for name in runs}
        for _ in range(3):  # interleaved
            for name, run in runs.items():
                rates[name].append(run())
        for name, values in rates.items():
            print(f"  {body.classifier.description.split(' (')[0]:28s} {name:20s} "
                  f"{statistics.median(values):8,.0f} samples/s  rounds {[round(v) for v in values]}")


if __name__ == "__main__":
    setup()
    torch.set_num_threads(1)
    print(f"OpenVINO {ov.__version__}, torch {torch.__version__}")
    for step in sys.argv[1:]:
        {"shapes": shapes, "variants": variants, "profile": profile, "pipeline": pipeline}[step]()
