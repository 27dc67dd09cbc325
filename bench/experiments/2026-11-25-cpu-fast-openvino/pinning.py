"""OpenVINO's CPU pinning with one process and with two processes at once (demo graph, 125 rows).

    python bench/experiments/2026-11-25-cpu-fast-openvino/pinning.py \
        > bench/results/2026-11-25-cpu-fast/openvino/pinning.txt

Each line: W worker threads, each with its own infer request, classifying back to back for 3 s,
3 rounds (median and rounds). Then two processes of one worker each, started together.
"""
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROWS = 125


def measure(workers: int, pin: bool) -> str:
    import numpy as np
    import openvino as ov

    from dmae_fast.demo import DEMO_CHECKPOINT
    from dmae_fast.engines.cpu_graphs import onnx_bytes
    from dmae_fast.model.checkpoints import load_classifier

    core = ov.Core()
    graph = core.read_model(onnx_bytes(load_classifier(DEMO_CHECKPOINT)))
    graph.reshape({0: ov.PartialShape([ROWS, 3, 8, 8])})
    compiled = core.compile_model(graph, "CPU", {"INFERENCE_NUM_THREADS": workers, "NUM_STREAMS": workers,
                                                 "INFERENCE_PRECISION_HINT": "f32", "ENABLE_CPU_PINNING": pin})
    requests = [compiled.create_infer_request() for _ in range(workers)]
    x = np.random.rand(ROWS, 3, 8, 8).astype(np.float32)

    def loop(request, stop):
        calls = 0
        while time.perf_counter() < stop:
            request.infer([x])
            calls += 1
        return calls * ROWS

    rates = []
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(3):
            start = time.perf_counter()
            rates.append(sum(pool.map(loop, requests, [start + 3] * workers)) / (time.perf_counter() - start))
    return (f"pinning {pin!s:5}  {workers} worker(s)  {statistics.median(rates):8,.0f} samples/s  "
            f"{[round(r) for r in rates]}")


if __name__ == "__main__":
    if len(sys.argv) == 3:
        print(measure(int(sys.argv[1]), sys.argv[2] == "True"), flush=True)
        sys.exit()
    for pin in (True, False):
        print("one process:", measure(2, pin), flush=True)
    for pin in (True, False):
        both = [subprocess.Popen([sys.executable, __file__, "1", str(pin)], stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
        for process in both:
            print("two processes at once:", process.communicate()[0].strip(), flush=True)
