#!/usr/bin/env bash
# Issue 36, step 8 speed record: `dmae-certify --nproc-per-node 2 --shard samples` on the demo (24 digits,
# fixed n and --sequential), the code before (BEFORE, a checkout prepared as for speed.sh) and after (this
# tree), alternated ROUNDS times in one run; each run's record gives its elapsed time and samples/s.
#   bash bench/experiments/2026-11-27-engine-loop/shard_samples_speed.sh BEFORE OUT [ROUNDS]
set -eu
BEFORE=${1:?usage: shard_samples_speed.sh BEFORE OUT [ROUNDS]}
OUT=${2:?usage: shard_samples_speed.sh BEFORE OUT [ROUNDS]}
ROUNDS=${3:-2}
PY=${PYTHON:-python}
# shellcheck source=versions.sh
. "$(dirname "$0")/versions.sh"
OUT=$(absolute_dir "$OUT")
C=(--data demo --max 24 --n0 100 --n 2000 --seed 7 --quiet --overwrite --device cpu --body plain
   --nproc-per-node 2 --shard samples)
run() {  # run VERSION ROUND
  in_version "$1" $PY -m dmae_fast.cli.certify "${C[@]}" --out "$OUT/fixed-$1-$2.tsv" 2> "$OUT/fixed-$1-$2.log"
  in_version "$1" $PY -m dmae_fast.cli.certify "${C[@]}" --sequential --out "$OUT/sequential-$1-$2.tsv" \
    2> "$OUT/sequential-$1-$2.log"
}
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then run before "$round"; run after "$round"; else run after "$round"; run before "$round"; fi
done
for f in "$OUT"/*.tsv.json; do
  $PY -c "import json, sys; r = json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/', 1)[1], r['elapsed_s'], r['samples_per_s'])" "$f"
done
