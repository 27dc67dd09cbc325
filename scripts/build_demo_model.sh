#!/usr/bin/env bash
# Rebuild the shipped demo classifier (dmae_fast/assets/demo-digits-vit.safetensors) with
# dmae-train alone, as dmae_fast/demo.py describes, i.e.
#   dmae-train pretrain --preset demo-pretrain --out WORK/pretrain
#   dmae-train finetune --preset demo-finetune --init WORK/pretrain/pretrain.pth --out WORK/finetune
# then copy WORK/finetune/classifier.safetensors into the package, draw the pre-training
# figure and certify every 10th test digit.
# Usage: scripts/build_demo_model.sh [WORK_DIR]   (default runs/demo; must not hold a run)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-runs/demo}
PYTHON=${PYTHON:-python}
time "$PYTHON" -m dmae_fast.demo --work "$WORK"
"$PYTHON" -m dmae_fast.train.command visualize --preset demo-visualize --init "$WORK/pretrain/pretrain.pth" \
    --out "$WORK/pretrain/figure.png"
"$PYTHON" -m dmae_fast.cli.certify --data demo --skip 10 --out "$WORK/certify-skip10.tsv"
