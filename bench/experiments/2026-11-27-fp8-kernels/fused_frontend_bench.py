"""Micro-benchmark of the fused front end (noise + patch embedding, issue 38): ms per batch per GPU tiling.

Times ``dmae_fast.kernels.fused_frontend.fused_tokens`` for each entry of its ``TILES`` (the first is
what the fast body uses), interleaved for ``--rounds`` rounds, on the front end of a random-weight
ViT-B/16 at 224 built as the fused body builds it (``model.fused_front_end(sigma)`` cast to
fp16; float32 clean embeddings E of 8 slots; a preallocated fp16 token buffer): B = 1024 rows, D 768,
16x16 patches. ``per-element`` is the kernel as it was before (one Philox call and one Box-Muller per
element, D tiled by 256), for the A/B. Each variant's tokens are compared with ``per-element``'s
(``same bits``: "split" has its blocks, so it must be 1.0; "wide" sums in other blocks, so ``max
diff`` shows the fp16 rounding). On CUDA each time is the median of ``triton.testing.do_bench``;
with ``--smoke`` a tiny model (4x4 patches) runs in Triton's interpreter, to check that the script
runs, not to time anything. Prints a table and writes it as JSON to --out.

    python bench/experiments/2026-11-27-fp8-kernels/fused_frontend_bench.py --out fused_frontend.json
    python bench/experiments/2026-11-27-fp8-kernels/fused_frontend_bench.py --smoke --out /tmp/ff.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from dmae_fast.kernels.fused_frontend import INTERPRETED, TILES, fused_tokens  # sets TRITON_INTERPRET=1 without CUDA

# isort: split
import triton

from dmae_fast.bench.throughput import build_model
from dmae_fast.model import ClassifierSpec, EncoderConfig, SmoothingClassifier

SIGMA, SEED, SLOTS = 0.25, 2**63 + 12345, 8


def milliseconds(fn, cuda: bool) -> float:
    """Median time of one call of ``fn`` in ms."""
    if cuda:
        return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024, help="rows (noisy samples) per call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a tiny model in the interpreter (CPU check)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write (must not exist)")
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"{args.out} exists already; name a new file with --out")
    cuda = torch.cuda.is_available() and not INTERPRETED
    if not cuda and not args.smoke:
        sys.exit("no CUDA device: run with --smoke (a tiny model in Triton's interpreter)")
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    if args.smoke:
        args.batch, args.rounds = 6, 1
        spec = ClassifierSpec(EncoderConfig(48, 1, 2, patch_size=4, img_size=16), num_classes=10, input_size=16)
        model = SmoothingClassifier(spec).eval().to(device)
    else:
        model = build_model("vit-b16", device)
    front = model.fused_front_end(SIGMA).cast(torch.float16)
    embeddings = model.clean_embedding(torch.rand(SLOTS, *front.image_shape, device=device))
    slot = torch.arange(args.batch, device=device) % SLOTS
    image, phase = slot + 2**31, torch.ones_like(slot)
    sample = torch.randint(0, 2**32, (args.batch,), device=device)
    out = torch.empty((args.batch, 1 + front.num_patches, front.embed_dim), dtype=torch.float16, device=device)

    def run(tiles: str) -> torch.Tensor:
        return fused_tokens(front, embeddings, slot, image, phase, sample, SEED, out=out, tiles=tiles)

    tokens = {tiles: run(tiles).clone() for tiles in TILES}
    times: dict[str, list[float]] = {tiles: [] for tiles in TILES}
    for _ in range(args.rounds):
        for tiles in TILES:
            times[tiles].append(milliseconds(lambda tiles=tiles: run(tiles), cuda))
    base = tokens["per-element"]
    rows = [{"variant": tiles, "ms": statistics.median(t), "same bits": torch.equal(tokens[tiles], base),
             "max diff": (tokens[tiles].float() - base.float()).abs().max().item(), "rounds ms": t}
            for tiles, t in times.items()]
    name = torch.cuda.get_device_name() if cuda else "CPU (interpreter)"
    print(f"{args.batch} rows x {front.num_patches} patches, D {front.embed_dim}, {front.patch}x{front.patch} "
          f"patches, fp16 weights on {name}, median of {args.rounds} rounds")
    print(f"{'variant':<14}{'ms per call':>12}{'same bits':>11}{'max diff':>10}")
    for row in rows:
        print(f"{row['variant']:<14}{row['ms']:>12.3f}{row['same bits']!s:>11}{row['max diff']:>10.2g}")
    record = {"batch": args.batch, "patches": front.num_patches, "dim": front.embed_dim, "patch": front.patch,
              "device": name, "torch": torch.__version__, "triton": triton.__version__, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
