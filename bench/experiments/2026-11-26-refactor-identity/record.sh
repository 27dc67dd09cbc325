#!/usr/bin/env bash
# Issue 26's "must not change" record: the demo's rows for fixed-n, --sequential, --predict, the
# fast and plain bodies, --nproc-per-node 2 (image and sample shards), and dmae-serve answers for a
# fixed seed and --first-index; written to DIR, then compared with compare.py (every column but time).
#   bash bench/experiments/2026-11-26-refactor-identity/record.sh DIR
set -eu
D=${1:?usage: record.sh DIR}
mkdir -p "$D"
PY=${PYTHON:-python}
C=(--data demo --max 24 --n0 50 --n 500 --seed 7 --quiet --overwrite --device cpu)
$PY -m dmae_fast.cli.certify "${C[@]}" --body plain --out "$D/fixed-plain.tsv"
$PY -m dmae_fast.cli.certify "${C[@]}" --body fast --out "$D/fixed-fast.tsv"
$PY -m dmae_fast.cli.certify "${C[@]}" --body plain --sequential --n 2000 --out "$D/sequential.tsv"
$PY -m dmae_fast.cli.certify "${C[@]}" --body plain --predict --out "$D/predict.tsv"
$PY -m dmae_fast.cli.certify "${C[@]}" --body plain --nproc-per-node 2 --out "$D/ddp-images.tsv"
$PY -m dmae_fast.cli.certify "${C[@]}" --body plain --nproc-per-node 2 --shard samples --out "$D/ddp-samples.tsv"
$PY "$(dirname "$0")/serve_answers.py" "$D/serve.json"
