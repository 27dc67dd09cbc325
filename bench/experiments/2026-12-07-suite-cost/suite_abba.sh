#!/usr/bin/env bash
# The README's test command on two checkouts, interleaved A B B A, each under /usr/bin/time (wall, user, sys).
# Usage: suite_abba.sh OLD_CHECKOUT NEW_CHECKOUT TIMES_FILE   (one venv: the one active, or .venv of NEW)
# Both checkouts must hold the same product code where the figures are to compare the tests alone: the editable
# install imports dmae_fast from wherever it was installed.
set -u
old=$1 new=$2 times=$3
for tag in old new new old; do
  if [ "$tag" = old ]; then dir=$old; else dir=$new; fi
  (cd "$dir" && /usr/bin/time -f "$tag wall %e user %U sys %S" \
      python -m pytest -q -n 2 --dist loadfile -p no:logging -p no:cacheprovider > "$times.$tag.$$.log" 2>> "$times")
done
