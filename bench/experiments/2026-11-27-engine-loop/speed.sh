#!/usr/bin/env bash
# Issue 36 (engine loop) speed record: dmae-bench cpu (demo, 2 threads) and dmae-bench serve (CPU),
# the code before (BEFORE: a checkout of the old commit whose dmae_fast/ holds symlinks kernels, export,
# train, bench to its top-level folders; versions.sh runs each version from its own folder) and after (this
# tree), alternated ROUNDS times in one run on one machine. Each dmae-bench run times Cohen et al.'s loop
# in the same process, so the ratios to it are what is compared.
#   bash bench/experiments/2026-11-27-engine-loop/speed.sh BEFORE OUT [ROUNDS]
set -eu
BEFORE=${1:?usage: speed.sh BEFORE OUT [ROUNDS]}
OUT=${2:?usage: speed.sh BEFORE OUT [ROUNDS]}
ROUNDS=${3:-2}
PY=${PYTHON:-python}
# shellcheck source=versions.sh
. "$(dirname "$0")/versions.sh"
OUT=$(absolute_dir "$OUT")
run() {  # run VERSION ROUND
  in_version "$1" $PY -m dmae_fast.cli.bench cpu --models demo --threads 2 --rounds 3 --commands \
    --out "$OUT/cpu-$1-$2" > "$OUT/cpu-$1-$2.log" 2>&1
  in_version "$1" $PY -m dmae_fast.cli.bench serve --device cpu --rounds 2 --saturation-seconds 4 --seconds 3 \
    --max-wait-ms 0 --loads 0.5 --out "$OUT/serve-$1-$2" > "$OUT/serve-$1-$2.log" 2>&1
}
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then run before "$round"; run after "$round"; else run after "$round"; run before "$round"; fi
done
