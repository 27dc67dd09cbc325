#!/usr/bin/env bash
# Rows of one checkout's dmae-certify runs, for comparing two checkouts column by column (time aside):
#   cd CHECKOUT && identity.sh PYTHON OUTDIR   (PYTHON: a venv's python with that checkout installed; run from the
#   checkout itself: python -m puts the current folder first on sys.path)
set -euo pipefail
py=$1 out=$2
mkdir -p "$out"
common=(--data demo --seed 0 --max 20 --skip 5 --quiet --overwrite --device cpu)
run() { local name=$1; shift; "$py" -m dmae_fast.cli.certify "${common[@]}" "$@" --out "$out/$name.tsv" 2> "$out/$name.err"; }
run fixed-fast --n0 100 --n 2000
run fixed-plain --n0 100 --n 2000 --body plain
run sequential --n0 100 --n 10000 --sequential
run predict --n 1000 --predict
run sound --n0 100 --n 2000 --sound
run sound-plain --n0 100 --n 2000 --sound --body plain
for f in "$out"/*.tsv; do
  "$py" -c "import sys; from pathlib import Path; lines=[l.split('\t') for l in Path(sys.argv[1]).read_text().splitlines()]
t=lines[0].index('time'); Path(sys.argv[1][:-4]+'.rows').write_text('\n'.join('\t'.join(c[:t]+c[t+1:]) for c in lines)+'\n')" "$f"
done
