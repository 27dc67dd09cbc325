#!/usr/bin/env bash
# Start-up of a one-image dmae-certify run (demo, --n 100), before and after a change, alternated.
#   BEFORE=<commit> bash bench/experiments/2026-11-26-startup/run.sh [rounds]
# "before" is that commit's package, run from a git worktree (the editable install's finder is
# taken off sys.meta_path so that the worktree's copy is imported); "after" the installed one.
# Warm caches (model cache, Inductor) for both: each ran once before the timed rounds.
set -euo pipefail
ROUNDS=${1:-5}
BEFORE=${BEFORE:?set BEFORE to a commit}
WT=$(mktemp -d)/before
git worktree add -q "$WT" "$BEFORE"
SHIM=$(mktemp -d)
mkdir -p "$SHIM/dmae_fast"
for f in "$WT"/dmae_fast/*; do ln -s "$f" "$SHIM/dmae_fast/"; done
for d in kernels export train bench; do ln -s "$WT/$d" "$SHIM/dmae_fast/$d"; done
cat > "$SHIM/run_before.py" <<PY
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, "$SHIM")
from dmae_fast.cli.entry import certify
sys.argv[0] = "dmae-certify"
sys.exit(certify())
PY
ARGS=(--data demo --max 1 --n 100 --overwrite --quiet)
python "$SHIM/run_before.py" "${ARGS[@]}" --out "$SHIM/warm-b.tsv" >/dev/null  # warm both caches
dmae-certify "${ARGS[@]}" --out "$SHIM/warm-a.tsv" >/dev/null
for i in $(seq 1 "$ROUNDS"); do
  /usr/bin/time -f "before %e" python "$SHIM/run_before.py" "${ARGS[@]}" --out "$SHIM/b$i.tsv" >/dev/null
  /usr/bin/time -f "after %e" dmae-certify "${ARGS[@]}" --out "$SHIM/a$i.tsv" >/dev/null
done
git worktree remove --force "$WT"
