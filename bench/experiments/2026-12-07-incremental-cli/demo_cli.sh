#!/usr/bin/env bash
# Issue 59, evidence 2 and 3 on the demo through the command line: the demo classifier in fp32 as the reference
# (CERTIFY n0 100, n 10,000, sigma 0.25, the first 100 test digits), and two derived classifiers, the same weights in
# bf16 (--precision bf16) and the fp16 ONNX export, each certified from scratch and with --reference (the default
# rule: from scratch above pA_lower 0.99, 2,000 paired samples elsewhere; and every image paired). Prints the
# summary table of every file and, per file, the forward passes (a paired sample is two) and the command's time.
# KEEP_VOTES=N: the reference keeps its votes on its first N estimation samples and the incremental runs read them
# (the derived classifier alone on the reference's noisy inputs: a paired sample is one pass); the from-scratch runs
# then take the reference's seed too, so that every derived run sees the same noise. DISAGREEMENT_RATE=D: also an
# incremental run with --disagreement-rate D (each image's paired samples chosen from its reference row).
#   bash bench/experiments/2026-12-07-incremental-cli/demo_cli.sh WORKDIR
#   KEEP_VOTES=2000 bash bench/experiments/2026-12-07-incremental-cli/demo_cli.sh WORKDIR
#   KEEP_VOTES=2000 DISAGREEMENT_RATE=0.001 bash bench/experiments/2026-12-07-incremental-cli/demo_cli.sh WORKDIR
set -euo pipefail
work=$1
mkdir -p "$work"
common=(--data demo --max 100 --sigma 0.25 --device cpu --quiet --overwrite)
timed() {  # name, then the command's arguments: run dmae-certify, keep its wall time
  local name=$1 start end
  shift
  start=$(date +%s.%N)
  dmae-certify "${common[@]}" "$@" --out "$work/$name.tsv" > /dev/null
  end=$(date +%s.%N)
  echo "$name $(echo "$end - $start" | bc)" >> "$work/times.txt"
}
: > "$work/times.txt"
dmae-export --ckpt demo --fp16 --out "$work/export" --overwrite > /dev/null
onnx=$(ls "$work"/export/*.onnx)
votes=()
if [ -n "${KEEP_VOTES:-}" ]; then votes=(--keep-votes "$KEEP_VOTES"); fi
timed reference --ckpt demo --n0 100 --n 10000 --seed 7 "${votes[@]}"
for derived in bf16 onnx; do
  if [ "$derived" = bf16 ]; then engine=(--ckpt demo --precision bf16); else engine=(--engine "$onnx"); fi
  seed=(--seed 8)
  if [ -n "${KEEP_VOTES:-}" ]; then seed=(); fi  # on the votes: the reference's seed
  scratch_seed=8
  if [ -n "${KEEP_VOTES:-}" ]; then scratch_seed=7; fi  # from scratch on the same noise as the incremental runs
  timed "$derived-scratch" "${engine[@]}" --n0 100 --n 10000 --seed "$scratch_seed"
  timed "$derived-incremental" "${engine[@]}" --reference "$work/reference.tsv" "${seed[@]}"
  timed "$derived-all-paired" "${engine[@]}" --reference "$work/reference.tsv" "${seed[@]}" --scratch-above 1
  if [ -n "${DISAGREEMENT_RATE:-}" ]; then
    timed "$derived-rate" "${engine[@]}" --reference "$work/reference.tsv" "${seed[@]}" \
      --disagreement-rate "$DISAGREEMENT_RATE"
  fi
done
dmae-certify analyze "$work"/*.tsv --radii 0 0.25 0.5 0.75
python - "$work" <<'PYEOF'
import sys
from pathlib import Path

from dmae_fast.results.format import read_results

work = Path(sys.argv[1])
times = dict(line.split() for line in (work / "times.txt").read_text().splitlines())
per_pair = 1 if (work / "reference.tsv.votes").exists() else 2  # on the votes only the derived classifier runs
for name, seconds in times.items():
    rows = read_results(work / f"{name}.tsv")
    n0, n = rows.extra["n0"], rows.extra["n"]
    if rows.extra["procedure"][0] == "incremental":  # paired rows (n0 0) run both classifiers
        passes = int(((n0 > 0) * (n0 + n) + (n0 == 0) * per_pair * n).sum())
        scratch = int((n0 > 0).sum())
    else:
        passes, scratch = int((n0 + n).sum()), len(rows)
    print(f"{name:22s} forward passes {passes:>9,}  from scratch {scratch:>3} of {len(rows)}  command {float(seconds):6.1f} s")
PYEOF
