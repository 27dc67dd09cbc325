#!/usr/bin/env bash
# The README's test command on two checkouts, interleaved A B B A, each under /usr/bin/time (wall, user, sys).
# Usage: suite_abba.sh OLD_CHECKOUT NEW_CHECKOUT TIMES_FILE
# Both run with the `python` on PATH (activate the venv first), whose editable install imports dmae_fast from where
# it was installed, so the two checkouts should differ in their tests only; or, to compare product code too, with
# PY_OLD and PY_NEW: each checkout's own venv python (each venv installed from its checkout: pip install -e).
# Each run's pytest output goes to TIMES_FILE.<run>-<old|new>.log, its per-test times to TIMES_FILE.<run>-<old|new>.xml
# (pytest's --junitxml; by_file.py compares them file by file).
set -u
old=$1 new=$2 times=$3
py_old=${PY_OLD:-python} py_new=${PY_NEW:-python}
run=0
for tag in old new new old; do
  run=$((run + 1))
  if [ "$tag" = old ]; then dir=$old py=$py_old; else dir=$new py=$py_new; fi
  (cd "$dir" && /usr/bin/time -f "$tag wall %e user %U sys %S" \
      "$py" -m pytest -q -n 2 --dist loadfile -p no:logging -p no:cacheprovider \
      --junitxml="$times.$run-$tag.xml" > "$times.$run-$tag.log" 2>> "$times")
done
