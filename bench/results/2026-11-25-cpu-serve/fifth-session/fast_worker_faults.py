import sys, time, resource, torch
import dmae_fast.memory as mem
if sys.argv[1] == "old": mem.M_ARENA_MAX = mem.M_MMAP_THRESHOLD  # thresholds only (the previous setting)
from dmae_fast.bench.throughput import build_model
from dmae_fast.engines import TorchEngine
from dmae_fast.certification.bodies import BodyOptions, batch_body
from dmae_fast.certification.stream import SamplingPlan, StreamingCertifier
torch.set_num_threads(2)
model = build_model(sys.argv[2], torch.device("cpu"))
engine = TorchEngine(model, torch.device("cpu"), "fp32")
batch = 100 if sys.argv[2] == "small-224" else 1000
body = batch_body(engine, 0.25, 0, batch, BodyOptions(fast=True, workers=2))
n = 1000 if sys.argv[2] == "small-224" else 10000
images = [torch.rand(model.spec.input_shape) for _ in range(2)]
run = lambda: list(StreamingCertifier(engine, SamplingPlan.predict(n), 0.25, 0, batch, body).run([(i, im, 0) for i, im in enumerate(images)]))
run()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt; t = time.perf_counter(); run(); dt = time.perf_counter() - t
f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(sys.argv[1], sys.argv[2], mem.keep_freed_memory(), f"{(f1 - f0) / (2 * n / 1000):,.0f} faults per 1000 samples, {2 * n / dt:,.0f} samples/s")
