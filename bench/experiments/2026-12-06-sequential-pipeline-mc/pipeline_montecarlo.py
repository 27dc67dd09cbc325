"""Monte-Carlo check of --sequential's continuous radius through the certifying pipeline (issue 58): images of a
classifier whose vote for class 0 has a known probability p, streamed through StreamingCertifier with the
sequential procedure's plan and stopping rule (noise generation, batches, looks, stop decisions, counts) and
certified by that procedure; the rate of pA_lower > p (a false certificate of the continuous radius) and of a
certified grid level above p's, against alpha.

The classifier reads one pixel: class 0 where (x - 0.5) / sigma < z, else 1, on images that are 0.5 everywhere;
the pipeline adds sigma * N(0, 1) noise, so a vote for class 0 has probability p = Phi(z) (the noise's float32
rounding moves it by ~1e-7). z sits just below a threshold where a false certificate is likeliest. Only the
classifier is a stand-in; everything from the image to the certificate is the command's (dmae-certify
--sequential at the same n0, cap, alpha and sigma uses this procedure with this plan).

    python bench/experiments/2026-12-06-sequential-pipeline-mc/pipeline_montecarlo.py TRIALS CAP SIGMA Z...
"""

from __future__ import annotations

import math
import secrets
import sys
import time

import torch
from scipy.special import ndtr

from dmae_fast import StreamingCertifier
from dmae_fast.engines.base import Engine
from dmae_fast.model.config import ClassifierSpec, EncoderConfig
from dmae_fast.stats.procedure import CERTIFY, Procedure, ProcedureSpec

N0, ALPHA, BATCH = 100, 0.01, 20_000


class OnePixelThreshold(Engine):
    """Class 0 where the first pixel's noise, in units of sigma, is below ``z``; class 1 otherwise."""

    def __init__(self, sigma: float, z: float) -> None:
        encoder = EncoderConfig(embed_dim=4, depth=0, num_heads=1, patch_size=1, img_size=2, in_chans=1)
        self.spec = ClassifierSpec(encoder, num_classes=2, input_size=2, mean=(0.0,), std=(1.0,))
        self.device, self.precision, self.description, self.input = torch.device("cpu"), "fp32", "threshold", "image"
        self.input_shape = self.spec.input_shape
        self.sigma, self.z = sigma, z

    def classify(self, images: torch.Tensor) -> torch.Tensor:
        noise = (images.reshape(len(images), -1)[:, 0].double() - 0.5) / self.sigma
        return (noise >= self.z).long()


def run(trials: int, cap: int, sigma: float, z: float) -> dict[str, float]:
    """The false-certificate rates over ``trials`` images at p = Phi(z), and the samples they took."""
    procedure = Procedure(ProcedureSpec(CERTIFY, cap, ALPHA, sigma, N0, sequential=True))
    engine = OnePixelThreshold(sigma, z)
    seed = secrets.randbits(63)  # fresh per run, as the command draws
    images = ((i, torch.full((1, 2, 2), 0.5), 0) for i in range(trials))
    p = float(ndtr(z))
    false_radius = false_grid = samples = certified = 0
    threshold_radius = sigma * z  # pA_lower > p  <=>  the radius exceeds sigma * Phi^-1(p)
    for done in StreamingCertifier(engine, procedure.plan, sigma, seed, BATCH).run(images, procedure.decide):
        result = procedure.result(done.counts)
        grid = procedure.extra(result).get("grid_radius", 0.0)
        certified += result.prediction == 0
        false_radius += result.prediction == 0 and result.p_a_lower > p
        false_grid += result.prediction == 0 and grid > threshold_radius
        samples += int(done.counts.sum())
    return {"p": p, "false_rate": false_radius / trials, "false_grid_rate": false_grid / trials,
            "certified": certified / trials, "samples_per_image": samples / trials, "seed": seed}


if __name__ == "__main__":
    trials, cap, sigma = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    limit = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials)
    print("trials\tcap\tsigma\tz\tp\tfalse_rate\tfalse_grid_rate\tlimit\tcertified\tsamples_per_image\tseconds\tseed")
    for z in map(float, sys.argv[4:]):
        start = time.perf_counter()
        r = run(trials, cap, sigma, z)
        print(f"{trials}\t{cap}\t{sigma}\t{z:.4f}\t{r['p']:.8f}\t{r['false_rate']:.5f}\t{r['false_grid_rate']:.5f}\t"
              f"{limit:.5f}\t{r['certified']:.4f}\t{r['samples_per_image']:.0f}\t{time.perf_counter() - start:.0f}\t"
              f"{r['seed']}", flush=True)
