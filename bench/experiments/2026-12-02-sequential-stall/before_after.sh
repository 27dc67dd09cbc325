#!/usr/bin/env bash
# dmae-bench stall for two checkouts, alternating processes so that a busy shared machine slows both alike:
#   before_after.sh PYTHON BEFORE_TREE OUT
# PYTHON: a venv's python with the current checkout installed (editable); BEFORE_TREE: a copy of the package
# folder dmae_fast/ (and bench/) of the code to compare, put first on PYTHONPATH. Runs from OUT, so that
# neither checkout's folder is the current one (python -m would put it first). Order: 16 images (3 rounds),
# 1,000 images (1 round), 16 images again, each before then after; caps 10,000 and 100,000 (the defaults).
set -euo pipefail
py=$1 before=$2 out=$3
mkdir -p "$out" && cd "$out"
run() {
  local tag=$1 images=$2 rounds=$3 dir
  dir="$out/$tag-$images-$SECONDS"
  if [ "$tag" = before ]; then
    PYTHONPATH="$before" "$py" -m dmae_fast.cli.bench stall --images "$images" --rounds "$rounds" --out "$dir"
  else
    "$py" -m dmae_fast.cli.bench stall --images "$images" --rounds "$rounds" --out "$dir"
  fi > "$dir.log" 2>&1
}
run before 16 3; run after 16 3
run before 1000 1; run after 1000 1
run before 16 3; run after 16 3
