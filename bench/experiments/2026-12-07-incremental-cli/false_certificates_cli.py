"""Issue 59, evidence 1 through the command line: the false-certificate rate of `dmae-certify --reference` rows, on
classifiers whose smoothed probabilities are known exactly.

The classifiers are linear rules on an image's mean pixel m (8x8 RGB, D = 192 values): f says 1 iff m > t, the
derived f' iff m > t + delta. Under Gaussian noise of sigma per value, m + mean(e) ~ N(m, sigma^2 / D), so
P(f'(x + e) = 1) = Phi((m - t - delta) sqrt(D) / sigma) exactly, and for a linear rule the smoothed classifier's
robust radius is exactly sigma * Phi^-1(p'_c) (Cohen et al.): a row certifying class c at radius r is false iff
p'_c <= 1/2 or r > sigma * Phi^-1(p'_c). Both rules are ONNX engine files with sidecars; the images are PNG files
named by a list file. The reference is a fixed-n run of f; the derived rows are `--reference` rows of f', every
image paired (`--scratch-above 1`: the bound itself under test) and with the default rule (confident images from
scratch). The paired rows are then re-derived with zeta_U replaced by the point estimate
d / n_p (the deliberately wrong bound), which must be flagged: its false-certificate rate above alpha + alpha_zeta.
With ``--votes`` the reference keeps its votes on its first n_p estimation samples (``--keep-votes``, the plain
body) and the derived rows count disagreements against them on those noisy inputs (the derived classifier alone).
With ``--disagreement-rate D`` a third derived run chooses each image's paired samples from its reference row
(``dmae-certify --disagreement-rate``: 5, 10, 20 or 50% of n, at most n_p, or from scratch).

    python bench/experiments/2026-12-07-incremental-cli/false_certificates_cli.py --images 20000 --work /tmp/fc
    python bench/experiments/2026-12-07-incremental-cli/false_certificates_cli.py --images 20000 --work /tmp/fc --votes
    python bench/experiments/2026-12-07-incremental-cli/false_certificates_cli.py --images 20000 --work /tmp/fc \
        --votes --paired-samples 1000 --disagreement-rate 0.01
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch
from PIL import Image
from scipy.stats import binom, norm

from dmae_fast.base.integrity import file_sha256
from dmae_fast.data import open_dataset
from dmae_fast.engines.sidecar import EMBEDDED_KEY, BatchRange, EngineMeta, embedded_fields, write_sidecar
from dmae_fast.model.config import ClassifierSpec, EncoderConfig
from dmae_fast.results.format import read_results

SIDE, SIGMA, THRESHOLD = 8, 0.25, 0.5
D = 3 * SIDE * SIDE
ALPHA = ALPHA_ZETA = 0.001


def derived_shift() -> float:
    """delta: the derived rule's shift, so that an image with P(f = 1) = 0.99 has P(f' = 1) = 0.98 (z = 0.01)."""
    return float((norm.ppf(0.99) - norm.ppf(0.98)) * SIGMA / np.sqrt(D))


class MeanRule(torch.nn.Module):
    """Logits (0, scale * (mean pixel - threshold)): class 1 iff the mean is above the threshold."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        score = (images.flatten(1).mean(1, keepdim=True) - self.threshold) * 1000.0
        return torch.cat([torch.zeros_like(score), score], dim=1)


def write_engine(path: Path, threshold: float) -> None:
    """The rule as an ONNX engine file with its sidecar (pixels in, logits out; identity normalization)."""
    torch.onnx.export(MeanRule(threshold), (torch.rand(2, 3, SIDE, SIDE),), str(path), input_names=["images"],
                      output_names=["logits"], dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
                      dynamo=False)
    spec = ClassifierSpec(EncoderConfig(8, 0, 1, patch_size=SIDE, img_size=SIDE), 2, SIDE, mean=(0.0, 0.0, 0.0),
                          std=(1.0, 1.0, 1.0), sigma=SIGMA)
    meta = EngineMeta("onnx", path.name, "image", "fp32", BatchRange(1, 1000, 100_000), spec, "cpu",
                      f"mean rule, threshold {threshold!r}", time.strftime("%Y-%m-%d"), {"onnx": onnx.__version__})
    model = onnx.load(str(path))
    entry = model.metadata_props.add()
    entry.key, entry.value = EMBEDDED_KEY, json.dumps(embedded_fields(meta))
    onnx.save(model, str(path))
    write_sidecar(path, EngineMeta(**{**vars(meta), "sha256": file_sha256(path)}))


def write_images(folder: Path, count: int, rng: np.random.Generator) -> Path:
    """``count`` PNGs whose mean pixel puts P(f = 1) (or P(f = 0)) across [0.6, 0.9995], most near 0.97-0.999 where
    a point estimate of the disagreement fails; and their list file."""
    folder.mkdir(parents=True, exist_ok=True)
    kind = rng.random(count)
    p = np.where(kind < 0.6, rng.uniform(0.97, 0.9995, count), rng.uniform(0.6, 0.97, count))
    sign = np.where(kind > 0.8, -1.0, 1.0)  # a fifth of the images on class 0's side
    means = THRESHOLD + sign * norm.ppf(p) * SIGMA / np.sqrt(D)
    lines = []
    for i, m in enumerate(means):
        total = int(round(m * 255 * D))  # the pixel sum, spread as evenly as 8-bit values allow
        pixels = np.full(D, total // D, dtype=np.int64)
        pixels[: total % D] += 1
        rng.shuffle(pixels)
        Image.fromarray(pixels.reshape(SIDE, SIDE, 3).astype(np.uint8), "RGB").save(folder / f"{i:06d}.png")
        lines.append(f"{i:06d}.png {int(sign[i] > 0)}")
    listing = folder / "list.txt"
    listing.write_text("\n".join(lines) + "\n")
    return listing


def certify(*args: object) -> float:
    """One dmae-certify run (seconds); stops the experiment on failure."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dmae_fast.cli.certify", *map(str, args)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"dmae-certify {' '.join(map(str, args))} failed:\n{done.stderr}")
    return time.perf_counter() - start


def false_rows(predict: np.ndarray, radius: np.ndarray, p_one: np.ndarray) -> np.ndarray:
    """Rows whose certificate is false for the rule with P(class 1) = p_one."""
    p_class = np.where(predict == 1, p_one, 1 - p_one)
    certified = predict >= 0
    with np.errstate(divide="ignore", invalid="ignore"):
        true_radius = np.where(p_class > 0.5, SIGMA * norm.ppf(p_class), 0.0)
    return certified & ((p_class <= 0.5) | (radius > true_radius))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--n", type=int, default=2_000, help="the reference's estimation samples")
    parser.add_argument("--paired-samples", type=int, default=200)
    parser.add_argument("--work", type=Path, required=True, help="a scratch folder (images, engines, rows)")
    parser.add_argument("--votes", action="store_true", help="the reference keeps votes; the derived runs read them")
    parser.add_argument("--disagreement-rate", type=float, help="also a derived run with this --disagreement-rate")
    args = parser.parse_args()
    work, rng, delta = args.work, np.random.default_rng(59), derived_shift()
    work.mkdir(parents=True, exist_ok=True)
    listing = write_images(work / "images", args.images, rng)
    write_engine(work / "f.onnx", THRESHOLD)
    write_engine(work / "f-derived.onnx", THRESHOLD + delta)
    common = ("--data", listing, "--sigma", SIGMA, "--device", "cpu", "--quiet", "--batch", 20_000, "--overwrite",
              "--workers", 1)
    votes = ("--keep-votes", args.paired_samples) if args.votes else ()
    seconds_ref = certify("--engine", work / "f.onnx", *common, "--n0", 100, "--n", args.n, "--alpha", ALPHA,
                          *votes, "--out", work / "ref.tsv")
    derived = ("--engine", work / "f-derived.onnx", *common, "--reference", work / "ref.tsv", "--paired-samples",
               args.paired_samples, "--alpha", ALPHA_ZETA)
    seconds_inc = certify(*derived, "--scratch-above", 1, "--out", work / "inc.tsv")
    seconds_rule = certify(*derived, "--out", work / "inc-rule.tsv")
    rate = args.disagreement_rate
    seconds_rate = rate and certify(*derived, "--disagreement-rate", rate, "--out", work / "inc-rate.tsv")
    dataset = open_dataset(str(listing), image_size=SIDE)
    reference = read_results(work / "ref.tsv")
    means = {int(i): float(dataset[int(i)][0].mean()) for i in reference.idx}  # the images as the runs read them

    def derived_truth(table):
        """P(f'(x + e) = 1) of each row's image."""
        m = np.array([means[int(i)] for i in table.idx])
        return norm.cdf((m - THRESHOLD - delta) * np.sqrt(D) / SIGMA)

    rows, rule_rows = read_results(work / "inc.tsv"), read_results(work / "inc-rule.tsv")
    p_derived = derived_truth(rows)
    false = false_rows(rows.predict, rows.radius, p_derived)
    rule_false = false_rows(rule_rows.predict, rule_rows.radius, derived_truth(rule_rows))
    scratch = rule_rows.extra["n0"] > 0
    n_p, d = rows.extra["n"], rows.extra["disagreements"]
    # zeta_U replaced by the point estimate (rows the reference abstained on drew nothing: they stay abstentions)
    wrong_bound = np.where(n_p > 0, rows.extra["reference_pA_lower"] - d / np.maximum(n_p, 1), 0.0)
    ref_predict = dict(zip(reference.idx.tolist(), reference.predict.tolist()))
    wrong_predict = np.where(wrong_bound >= 0.5, [ref_predict[int(i)] for i in rows.idx], -1)
    with np.errstate(invalid="ignore"):
        wrong_radius = np.where(wrong_predict >= 0, SIGMA * norm.ppf(np.clip(wrong_bound, 0.5, 1.0)), 0.0)
    wrong = false_rows(wrong_predict, wrong_radius, p_derived)
    total, allowed = len(rows), ALPHA + ALPHA_ZETA
    bound = int(binom.ppf(1 - 1e-4, total, allowed))  # a count above it is a rate above alpha + alpha_zeta
    print(f"{total:,} images, sigma {SIGMA}, reference n0 100 n {args.n:,} alpha {ALPHA}, derived shift delta "
          f"{delta:.6f} (z 0.01 at p 0.99), n_p {args.paired_samples}, alpha_zeta {ALPHA_ZETA}, paired samples: "
          f"{'the reference votes on its first n_p estimation samples' if args.votes else 'fresh, both classifiers'}")
    print(f"commands: reference {seconds_ref:.0f} s, incremental all paired {seconds_inc:.0f} s, with the default "
          f"rule {seconds_rule:.0f} s (this machine, 2 cores; each includes ~4 s of imports)")
    print(f"derived rows certified: {int((rows.predict >= 0).sum()):,}; disagreements per image: mean "
          f"{d.mean():.2f}, max {int(d.max())}")
    print(f"false certificates, the rows as written: {int(false.sum())} of {total:,} ({false.mean():.6f}); allowed "
          f"alpha + alpha_zeta = {allowed} (a count above {bound} would reject it at 1e-4)")
    print(f"false certificates, zeta_U replaced by d / n_p: {int(wrong.sum())} of {total:,} ({wrong.mean():.6f})")
    print(f"default rule (from scratch above pA_lower 0.99): {int(scratch.sum()):,} images from scratch, "
          f"{int((~scratch).sum()):,} paired; false certificates {int(rule_false.sum())} of {len(rule_rows):,}")
    verdict = false.sum() <= bound and rule_false.sum() <= bound and wrong.sum() > bound
    if rate:
        rate_rows = read_results(work / "inc-rate.tsv")
        rate_false = false_rows(rate_rows.predict, rate_rows.radius, derived_truth(rate_rows))
        sizes = rate_rows.extra["n"][rate_rows.extra["n0"] == 0]
        chosen = {int(size): int(count) for size, count in zip(*np.unique(sizes, return_counts=True))}
        passes = int(rate_rows.extra["n"].sum() + rate_rows.extra["n0"].sum())
        print(f"--disagreement-rate {rate} ({seconds_rate:.0f} s): paired samples chosen {chosen} (0: abstained), "
              f"{int((rate_rows.extra['n0'] > 0).sum()):,} from scratch; {passes:,} passes (from scratch "
              f"{total * (100 + args.n):,}); false certificates {int(rate_false.sum())} of {len(rate_rows):,}")
        verdict = verdict and rate_false.sum() <= bound
    print("verdict:", "PASS" if verdict else "FAIL")


if __name__ == "__main__":
    main()
