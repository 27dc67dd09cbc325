"""The ceiling of faster attention and GELU kernels on the demo model, fp32, this CPU.

Record of the fifth 2026-11-25 session (issue 12); run from the repository root:

    python bench/experiments/2026-11-25-cpu-fast-demo-ceiling/ceiling.py \
        > bench/results/2026-11-25-cpu-fast/demo-ceiling/ceiling.txt

ONNX Runtime (today's --fast classifier, 128-row chunks, no noise) on three graphs of the demo
model: as it is; with attention costing nothing (each block's attention replaced by the value
projection: the qkv and output linear layers keep their FLOPs, the scores, softmax and
weighted sum are gone); and with GELU costing nothing too (identity). Cohen et al.'s loop on
the real model at the same thread count, interleaved, medians of ROUNDS. On two threads each
ORT graph runs as two concurrent one-thread sessions (as the --fast workers do). A graph
without attention is not the model: this bounds what any attention/GELU kernel could give.
"""

import copy
import statistics
import threading
import time

import onnxruntime as ort
import torch

from dmae_fast.base.memory import keep_freed_memory
from dmae_fast.bench.reference_loops import COHEN
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.cpu_graphs import onnx_bytes
from dmae_fast.model.checkpoints import load_classifier

ROUNDS, CHUNK, SECONDS = 5, 128, 2.0


class ValueOnly(torch.nn.Module):
    """A block's attention with free scores: proj(v), v from the same qkv linear layer."""

    def __init__(self, attn: torch.nn.Module) -> None:
        super().__init__()
        self.qkv, self.proj = attn.qkv, attn.proj

    def forward(self, x: torch.Tensor, **_) -> torch.Tensor:
        batch, tokens, width = x.shape
        return self.proj(self.qkv(x).reshape(batch, tokens, 3, width)[:, :, 2])


def session(graph: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def ort_rate(graph: bytes, chunk, threads: int) -> float:
    sessions = [session(graph) for _ in range(threads)]
    for s in sessions:
        s.run(None, {"images": chunk})
    calls = [0] * threads
    stop = time.perf_counter() + SECONDS

    def work(k: int) -> None:
        while time.perf_counter() < stop:
            sessions[k].run(None, {"images": chunk})
            calls[k] += 1
    start = time.perf_counter()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(calls) * CHUNK / (time.perf_counter() - start)


def cohen_rate(model, image, threads: int) -> float:
    torch.set_num_threads(threads)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < SECONDS:
        COHEN.counts(model, image, 2000, 0.25)
        calls += 1
    return calls * 2000 / (time.perf_counter() - start)


def main() -> None:
    allocator = keep_freed_memory()
    model = load_classifier(DEMO_CHECKPOINT).eval()
    image = demo_digits("test")[0][0]
    chunk = torch.rand((CHUNK, *model.spec.input_shape), generator=torch.Generator().manual_seed(0)).numpy()
    no_attention = copy.deepcopy(model)
    for block in no_attention.blocks:
        block.attn = ValueOnly(block.attn)
    no_gelu = copy.deepcopy(no_attention)
    for block in no_gelu.blocks:
        block.mlp.act = torch.nn.Identity()
    graphs = {"ORT, the model": onnx_bytes(model), "ORT, attention free": onnx_bytes(no_attention),
              "ORT, attention and GELU free": onnx_bytes(no_gelu)}
    print(f"torch {torch.__version__}, ONNX Runtime {ort.__version__}; {allocator}; "
          f"medians of {ROUNDS} interleaved rounds")
    for threads in (1, 2):
        rates = {"Cohen et al. loop": []} | {name: [] for name in graphs}
        cohen_rate(model, image, threads)
        for _ in range(ROUNDS):
            rates["Cohen et al. loop"].append(cohen_rate(model, image, threads))
            for name, graph in graphs.items():
                rates[name].append(ort_rate(graph, chunk, threads))
        cohen = statistics.median(rates["Cohen et al. loop"])
        for name, values in rates.items():
            rate = statistics.median(values)
            print(f"{threads} thread(s)  {name:30s} {rate:8,.0f} samples/s  {rate / cohen:.2f}x Cohen")


if __name__ == "__main__":
    main()
