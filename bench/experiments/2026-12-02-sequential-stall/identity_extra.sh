#!/usr/bin/env bash
# More dmae-certify runs for comparing two checkouts row by row (time aside), beside
# ../2026-12-02-concept-homes/identity.sh: more images in flight, the 100,000 cap, the Bonferroni test, the plain
# body at batch 256, sigma 1.0. Run from the checkout: identity_extra.sh PYTHON OUTDIR
set -euo pipefail
py=$1 out=$2
mkdir -p "$out"
common=(--data demo --seed 0 --quiet --overwrite --device cpu)
run() { local name=$1; shift; "$py" -m dmae_fast.cli.certify "${common[@]}" "$@" --out "$out/$name.tsv" 2> "$out/$name.err"; }
run seq-200 --max 200 --n0 100 --n 10000 --sequential
run seq-100k --max 40 --n0 100 --n 100000 --sequential
run seq-bonf --max 60 --n0 100 --n 10000 --sequential --sequential-test bonferroni
run seq-plain --max 60 --n0 100 --n 10000 --sequential --body plain --batch 256
run seq-sigma1 --max 60 --n0 100 --n 10000 --sequential --sigma 1.0
for f in "$out"/*.tsv; do
  "$py" -c "import sys; from pathlib import Path; lines=[l.split('\t') for l in Path(sys.argv[1]).read_text().splitlines()]
t=lines[0].index('time'); Path(sys.argv[1][:-4]+'.rows').write_text('\n'.join('\t'.join(c[:t]+c[t+1:]) for c in lines)+'\n')" "$f"
done
