#!/usr/bin/env bash
# Peak resident memory (GNU time's %M, KiB) of one dmae-certify run in two checkouts, interleaved:
#   memory.sh PYTHON ROUNDS BEFORE_CHECKOUT AFTER_CHECKOUT
# (python -m puts the current folder first on sys.path, so each run imports its checkout's dmae_fast)
set -euo pipefail
py=$1 rounds=$2; shift 2
for _ in $(seq "$rounds"); do
  for checkout in "$@"; do
    (cd "$checkout" && /usr/bin/time -f "$(basename "$checkout") %M KB %e s" "$py" -m dmae_fast.cli.certify --data demo \
      --seed 0 --max 20 --skip 5 --n 2000 --device cpu --quiet --overwrite --out "/tmp/memory-$(basename "$checkout").tsv" \
      2>&1 | tail -1)
  done
done
