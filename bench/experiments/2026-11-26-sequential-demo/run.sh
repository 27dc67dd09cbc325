#!/usr/bin/env bash
# Issue 27's demo table: 100 demo digits at sigma 0.25 and 0.5, fixed-n 10,000 and 100,000 against
# --sequential (exact group-sequential tests) with caps 10,000 and 100,000 and the Bonferroni test
# (cap 10,000), same seed; then table.py -> DIR/demo-table.md.
#   bash bench/experiments/2026-11-26-sequential-demo/run.sh DIR
set -eu
D=${1:?usage: run.sh DIR}
mkdir -p "$D"
PY=${PYTHON:-python}
for sigma in 0.25 0.5; do
    C=(--data demo --max 100 --n0 100 --sigma "$sigma" --seed 3 --quiet --overwrite)
    $PY -m dmae_fast.cli.certify "${C[@]}" --n 10000 --out "$D/fixed-10k-s$sigma.tsv"
    $PY -m dmae_fast.cli.certify "${C[@]}" --n 10000 --sequential --out "$D/exact-10k-s$sigma.tsv"
    $PY -m dmae_fast.cli.certify "${C[@]}" --n 100000 --sequential --out "$D/exact-100k-s$sigma.tsv"
    $PY -m dmae_fast.cli.certify "${C[@]}" --n 10000 --sequential --sequential-test bonferroni \
        --out "$D/bonferroni-10k-s$sigma.tsv"
    $PY -m dmae_fast.cli.certify "${C[@]}" --n 100000 --out "$D/fixed-100k-s$sigma.tsv"
done
$PY "$(dirname "$0")/table.py" "$D" > "$D/demo-table.md"
