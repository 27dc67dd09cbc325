"""The embedded demo: a DMAE-pre-trained ViT for scikit-learn's 8x8 digits.

The shipped classifier (``DEMO_CHECKPOINT``) is built by ``dmae-train`` alone, with the paper's two stages at toy
scale (presets ``demo-pretrain`` and ``demo-finetune``): DMAE pre-training on the 1,297 training digits at sigma
0.25 (ViT width 64, 4 blocks, 4 heads, 2x2 patches), then fine-tuning with consistency regularization at sigma 0.25,
the checkpoint selected on 15% of the training digits. Noise is added at 8x8 with no resize inside the classifier,
so radii are in 8x8 [0, 1] pixel units; the 500 test digits are never used for training or selection. Rebuild with
``python -m dmae_fast.demo`` (or ``scripts/build_demo_model.sh``)."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

from dmae_fast.demo_files import DEMO_CHECKPOINT  # re-exported: the demo model file


def main() -> int:
    from dmae_fast.data import demo_digits
    from dmae_fast.model.checkpoints import load_classifier
    from dmae_fast.train import command as train

    parser = argparse.ArgumentParser(description="Rebuild the embedded demo classifier with dmae-train.")
    parser.add_argument("--work", type=Path, default=Path("runs/demo"), help="run directory (must not hold a run)")
    parser.add_argument("--out", type=Path, default=DEMO_CHECKPOINT, help="where to copy the classifier")
    args = parser.parse_args()
    start = time.perf_counter()
    pretrain = ["pretrain", "--preset", "demo-pretrain", "--out", str(args.work / "pretrain"), "--quiet"]
    finetune = ["finetune", "--preset", "demo-finetune", "--init", str(args.work / "pretrain" / "pretrain.pth"),
                "--out", str(args.work / "finetune"), "--quiet"]
    for command in (pretrain, finetune):
        status = train.main(command)
        if status:
            return status
    shutil.copyfile(args.work / "finetune" / "classifier.safetensors", args.out)
    model, test = load_classifier(args.out), demo_digits("test")
    with torch.no_grad():
        accuracy = (model(test.images).argmax(1) == test.labels).float().mean().item()
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s; clean test accuracy {accuracy:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
