#!/usr/bin/env bash
# Issue 36, steps 7-8: the plain body's samples/s in one dmae-certify process (demo, 3 digits x (100 +
# 10,000) samples, CPU), the code before (BEFORE, prepared as for speed.sh) and after (this tree),
# alternated ROUNDS times; prints each run record's samples/s.
#   bash bench/experiments/2026-11-27-engine-loop/plain_speed.sh BEFORE OUT [ROUNDS]
set -eu
BEFORE=${1:?usage: plain_speed.sh BEFORE OUT [ROUNDS]}
OUT=${2:?usage: plain_speed.sh BEFORE OUT [ROUNDS]}
ROUNDS=${3:-4}
PY=${PYTHON:-python}
# shellcheck source=versions.sh
. "$(dirname "$0")/versions.sh"
OUT=$(absolute_dir "$OUT")
C=(--data demo --max 3 --n0 100 --n 10000 --seed 7 --quiet --overwrite --device cpu --body plain)
run() {  # run VERSION ROUND
  in_version "$1" $PY -m dmae_fast.cli.certify "${C[@]}" --out "$OUT/plain-$1-$2.tsv" > "$OUT/plain-$1-$2.log" 2>&1
}
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then run before "$round"; run after "$round"; else run after "$round"; run before "$round"; fi
done
for f in "$OUT"/*.tsv.json; do
  $PY -c "import json, sys; r = json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/', 1)[1], r['samples_per_s'])" "$f"
done
