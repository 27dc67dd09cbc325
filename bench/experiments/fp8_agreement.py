"""How often an fp8 body predicts what the fp16 body predicts, on noisy samples.

    python bench/experiments/fp8_agreement.py --out DIR [--device cuda] [--samples 20000]

For the demo classifier (trained, on the demo test digits) and a random-weight ViT-B/16 (on
random images): noisy samples x + sigma * eta (sigma 0.25 and 0.5), classified by
``TorchEngine`` in fp16 and in fp8 (and bf16, as the scale of a precision change fp16 users
already accept); the top-1 agreement of each with fp16, and of the fp8 body (GELU fused into the
quantization of fc2's input) with the same fp8 layers run unfused (GELU as its own module).
Writes DIR/fp8-agreement.json and .md.
Certified accuracy is compared with dmae-certify runs (bench/gpu_session.sh, step fp8).
Public API only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

from dmae_fast.bench.throughput import MODEL_SPECS, build_model
from dmae_fast.data import demo_digits
from dmae_fast.engines.torch_engine import TorchEngine


def images_for(model_name: str, count: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    if model_name == "demo":
        data = demo_digits("test")
        return torch.stack([data[i][0] for i in range(min(count, len(data)))]).to(device)
    shape = MODEL_SPECS[model_name].input_shape
    return torch.rand((count, *shape), generator=generator).to(device)


def unfused_fp8(model: nn.Module, device: torch.device) -> TorchEngine:
    """An fp8 engine whose MLPs apply GELU as its own module before fc2 (as before the fused
    GELU + quantization pass): its own quantized copy, changed in place."""
    engine = TorchEngine(model, device, "fp8")
    for block in engine.runs.blocks:
        block.mlp.act, block.mlp.fc2.gelu_input = nn.GELU(), False
    return engine


def agreement(model_name: str, samples: int, sigma: float, device: torch.device, batch: int) -> dict:
    torch.manual_seed(0)  # the random-weight models: the same draw in every run (their agreement varies by draw)
    model = build_model(model_name, device)
    engines = {p: TorchEngine(model, device, p) for p in ("fp16", "bf16", "fp8")}
    fp8_unfused = unfused_fp8(model, device)
    fused_same = 0
    generator = torch.Generator().manual_seed(0)
    images = images_for(model_name, 64, device, generator)
    same = dict.fromkeys(("bf16", "fp8"), 0)
    total = 0
    noise = torch.Generator(device=device).manual_seed(1)
    while total < samples:
        rows = min(batch, samples - total)
        clean = images[torch.arange(total, total + rows, device=device) % len(images)]
        noisy = clean + sigma * torch.randn(clean.shape, generator=noise, device=device)
        reference = engines["fp16"].classify(noisy)
        for precision in same:
            same[precision] += int((engines[precision].classify(noisy) == reference).sum())
        fused_same += int((engines["fp8"].classify(noisy) == fp8_unfused.classify(noisy)).sum())
        total += rows
    return {"model": model_name, "sigma": sigma, "samples": total,
            **{f"{p}_agreement_with_fp16": same[p] / total for p in same},
            "fp8_agreement_with_fp8_unfused": fused_same / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--models", nargs="+", default=["demo", "vit-b16"])
    args = parser.parse_args()
    device = torch.device(args.device)
    results = []
    for name in args.models:
        for sigma in (0.25, 0.5):
            results.append(agreement(name, args.samples, sigma, device, 1024 if name != "demo" else 4096))
            print(results[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8-agreement.json").write_text(json.dumps({"device": str(torch.cuda.get_device_name(device)
                                                        if device.type == "cuda" else device), "rows": results},
                                                       indent=1))
    lines = ["| model | sigma | samples | bf16 = fp16 | fp8 = fp16 | fp8 = fp8 unfused |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['sigma']} | {r['samples']:,} | {r['bf16_agreement_with_fp16']:.2%} | "
              f"{r['fp8_agreement_with_fp16']:.2%} | {r['fp8_agreement_with_fp8_unfused']:.2%} |" for r in results]
    (out / "fp8-agreement.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
