# Sourced by the one-off device-call scripts (gpu_call_*.sh): a results folder R, `step NAME
# SECONDS COMMAND...` (output to R/logs/NAME.log, status and seconds to R/steps.tsv) and `pack`
# (R -> OUT/gpu-call.tar.gz after every step, so a step cut by the lease keeps what came before).
# Keep what a step writes small: the device tool brings back 16 MiB per file.
set -u
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT}"
PY=${PYTHON:-python3}
R=$(mktemp -d)
mkdir -p "$R/logs"
export PY R
pack() { tar -czf "$OUT/gpu-call.tar.gz" -C "$R" .; }
step() {  # NAME SECONDS COMMAND...
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    timeout --kill-after=5 "$limit" "$@" > "$R/logs/$name.log" 2>&1
    printf '%s\t%s\t%s\n' "$name" "$?" "$((SECONDS - start))" | tee -a "$R/steps.tsv"
    pack
}
