"""What incremental certification saves on the demo: a derived engine of the demo classifier (bf16 weights, or the
fp16 ONNX export) certified from scratch against incrementally from the fp32 reference's run, by the rule "from
scratch where the reference's pA_lower is above a threshold, free where it abstained, paired samples elsewhere".

Cost is counted in forward passes of one noisy input (a paired sample costs two: the reference's vote is drawn
again, not stored). Certified accuracy at each 0.25 step and ACR are reported for each way. Run (2-core CPU, ~10 min):

    python bench/experiments/2026-12-07-incremental/demo_savings.py --images 100 \
        > bench/results/2026-12-07-incremental/demo-savings.txt
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch

from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import StreamingCertifier
from dmae_fast.data import demo_digits
from dmae_fast.demo_files import DEMO_CHECKPOINT
from dmae_fast.engines.opening import EngineOptions, open_engine
from dmae_fast.engines.paired import PairedEngine
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.export.config import ExportConfig
from dmae_fast.export.pipeline import export_engines
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.stats.decisions import ABSTAIN, Certificate, certify_from_counts
from dmae_fast.stats.incremental import disagreements, incremental_certificate
from dmae_fast.stats.plan import Phase, SamplingPlan

SIGMA, SEED, ALPHA, ALPHA_ZETA, N0, N = 0.25, 7, 0.001, 0.001, 100, 10_000
RADII = (0.0, 0.25, 0.5, 0.75)


def certificates(engine, images, plan) -> dict[int, np.ndarray]:
    smoothing = Smoothing(engine, SIGMA, SEED, 1000)
    return {done.index: done.counts for done in StreamingCertifier(smoothing, plan).run(images)}


def outcomes(certs: dict[int, Certificate]) -> dict[int, tuple[int, float]]:
    return {i: (c.prediction, c.radius) for i, c in certs.items()}


def summary(results: dict[int, tuple[int, float]], labels: dict[int, int]) -> str:
    """Certified accuracy (%) at each radius of RADII, and ACR, of (prediction, radius) per image."""
    correct = [(prediction == labels[i], radius) for i, (prediction, radius) in results.items()]
    accuracy = [100 * np.mean([ok and radius >= r for ok, radius in correct]) for r in RADII]
    acr = np.mean([radius if ok else 0.0 for ok, radius in correct])
    return "  ".join(f"r={r}: {a:5.1f}" for r, a in zip(RADII, accuracy)) + f"  ACR {acr:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(2)
    test = demo_digits("test")
    images = [(i, test.images[i], int(test.labels[i])) for i in range(args.images)]
    labels = {i: label for i, _, label in images}
    model = load_classifier(DEMO_CHECKPOINT)
    cpu = torch.device("cpu")
    reference = TorchEngine(model, cpu, "fp32")
    with tempfile.TemporaryDirectory() as folder:
        [onnx_file] = export_engines(ExportConfig(str(DEMO_CHECKPOINT), folder, ("onnx",), "fp16", seed=0,
                                                  device="cpu"), report=lambda line: None)
        derived_engines = {"bf16 weights (torch)": TorchEngine(model, cpu, "bf16"),
                           "fp16 ONNX export": open_engine(onnx_file, EngineOptions(device="cpu"))}
        print(f"demo test digits 0-{args.images - 1}, sigma {SIGMA}, n0 {N0}, n {N:,}, alpha {ALPHA}, "
              f"alpha_zeta {ALPHA_ZETA} (incremental rows hold at {ALPHA + ALPHA_ZETA}), seed {SEED}")
        reference_counts = certificates(reference, images, SamplingPlan.certify(N0, N))
        refs: dict[int, Certificate] = {i: certify_from_counts(c[0], c[1], ALPHA, SIGMA)
                                        for i, c in reference_counts.items()}
        print(f"reference fp32, from scratch: {summary(outcomes(refs), labels)}")
        p_lowers = np.array([c.p_a_lower for c in refs.values()])
        print("reference pA_lower quantiles (10/50/90%):", np.round(np.quantile(p_lowers, [0.1, 0.5, 0.9]), 5))
        for name, derived in derived_engines.items():
            scratch_counts = certificates(derived, images, SamplingPlan.certify(N0, N))
            scratch = {i: certify_from_counts(c[0], c[1], ALPHA, SIGMA) for i, c in scratch_counts.items()}
            scratch_cost = len(images) * (N0 + N)
            print(f"\n{name}: from scratch: {summary(outcomes(scratch), labels)}"
                  f"  forward passes {scratch_cost:,}")
            for n_p in (500, 1000, 2000):
                pairs = certificates(PairedEngine(reference, derived), images,
                                     SamplingPlan((Phase.ESTIMATION,), (n_p,)))
                classes = reference.spec.num_classes
                for threshold in (1.01, 0.999, 0.99):  # 1.01: never from scratch
                    results, cost, kinds = {}, 0, {"scratch": 0, "paired": 0, "free": 0}
                    for i, ref in refs.items():
                        if ref.prediction == ABSTAIN:
                            results[i], kinds["free"] = (ABSTAIN, 0.0), kinds["free"] + 1
                        elif ref.p_a_lower > threshold:
                            results[i] = (scratch[i].prediction, scratch[i].radius)
                            cost, kinds["scratch"] = cost + N0 + N, kinds["scratch"] + 1
                        else:
                            d = disagreements(pairs[i][0], classes, ref.prediction)
                            certificate = incremental_certificate(ref, d, n_p, ALPHA, ALPHA_ZETA, SIGMA)
                            results[i] = (certificate.prediction, certificate.radius)
                            cost, kinds["paired"] = cost + 2 * n_p, kinds["paired"] + 1
                    total_d = sum(disagreements(pairs[i][0], classes, ref.prediction) for i, ref in refs.items()
                                  if ref.prediction != ABSTAIN)
                    print(f"  n_p {n_p:5,}, from scratch above pA_lower {threshold}: {summary(results, labels)}  "
                          f"forward passes {cost:,} ({cost / scratch_cost:.2f} of from scratch; {kinds}); "
                          f"disagreements {total_d} of {n_p * sum(r.prediction != ABSTAIN for r in refs.values()):,}")


if __name__ == "__main__":
    main()
