#!/usr/bin/env bash
# One-call GPU session: versions, install, GPU tests, demo counts GPU vs CPU, dmae-bench --all.
#
#   OUT=/path/for/results bash bench/gpu_session.sh          # from the repository root
#
# Steps, in order, each under `timeout` (a failed or timed-out step is recorded and the next
# one runs): versions; install (pip install --no-deps --no-build-isolation -e ., else a
# PYTHONPATH shim); gpu-tests (pytest -m gpu on the files with GPU tests); tests (stream,
# fast stream, engine and export tests on this machine); demo (dmae-certify fp32 on the
# demo digits: CUDA counts must equal this machine's CPU counts); train (DMAE ViT-B
# pre-training images/s in bf16, bench/train_throughput.py); bench (dmae-bench --all, its
# --budget = what is left of SESSION_SECONDS). Everything lands under $OUT:
#   steps.tsv (step, exit status, seconds), session.log, logs/<step>.log, tests/*.xml (junit),
#   demo/*.tsv, train/<date>-<gpu>-pretrain.json/.md, bench/<date>-<gpu>.json/.md/.png,
#   bench/engines/*.json (engine sidecars).
# Exit status: 0 if every step passed, else 1 (the failed steps are listed at the end).
# PACK=<folder> (e.g. the device tool's $OUT, which brings back 8 files at most): on exit, even
# after a failed step or a TERM/INT, everything under $OUT is packed into PACK/gpu-session.tar.gz,
# and session.log and steps.tsv are copied beside it (3 files).
#
# Further GPU steps (in the default list on a GPU, not in smoke mode): gpu-aoti (the .pt2 GPU
# tests, last and alone: see AOTI_TESTS), fp8 (top-1 agreement of fp8
# with fp16, bench/experiments/fp8_agreement.py, and the demo certified in fp16 and fp8 with
# --fast, 100 digits, n 10,000 -> fp8/), sound (--sound against the default noise on the same
# body, bench/experiments/2026-11-27-sound/sound_speed.py with SOUND_ARGS -> sound/), profile
# (per-stage time and top CUDA kernels of a ViT-B
# batch, bench/experiments/gpu_profile.py with PROFILE_ARGS -> profile/), serve
# (dmae-bench serve on CUDA, SERVE_ARGS -> serve/), scaling (dmae-bench scaling, 1 and 2
# processes sharing GPU 0, then --shard samples with 2 processes: the NCCL all-reduce -> scaling/).
# Environment: STEPS (default all: "versions install gpu-tests tests demo train bench fp8 sound
# profile serve scaling gpu-aoti"; e.g. one device call for the checks and one for the bench), SESSION_SECONDS
# (default 550: the whole script), PYTHON (default python3), WHEELS (a folder of wheels that
# the machine lacks, installed with --no-deps into SCRATCH/site on PYTHONPATH, e.g. .whl),
# BENCH_ARGS (default below), SCRATCH (default a temporary folder: exported engines, which
# are too large to bring back), GPU_SESSION_SMOKE=1 (CPU smoke sizes, no install: the test
# that keeps this script working, tests/test_bench.py; there every step limit and SESSION_SECONDS are
# multiplied by LIMIT_SCALE, default 10: on a CPU the limits only guard against hangs, and a busy
# machine must not fail the smoke run).
set -u

: "${OUT:?set OUT to the folder for the results}"
PY=${PYTHON:-python3}
SMOKE=${GPU_SESSION_SMOKE:-0}
if [ "$SMOKE" = 1 ]; then SCALE=${LIMIT_SCALE:-10}; else SCALE=${LIMIT_SCALE:-1}; fi
TOTAL=$((${SESSION_SECONDS:-550} * SCALE))
SCRATCH=${SCRATCH:-$(mktemp -d)}
mkdir -p "$OUT/logs" "$OUT/tests" "$OUT/demo" "$OUT/bench/engines" "$SCRATCH"
FAILED=""
SECONDS=0

log() { echo "$*" | tee -a "$OUT/session.log"; }

# pack: $OUT -> $PACK/gpu-session.tar.gz (+ session.log, steps.tsv), once, on any exit
pack() {
    [ -n "${PACK:-}" ] && [ -z "${PACKED:-}" ] || return 0
    PACKED=1
    mkdir -p "$PACK" && tar -czf "$PACK/gpu-session.tar.gz" -C "$OUT" . &&
        cp "$OUT/session.log" "$OUT/steps.tsv" "$PACK/" 2>/dev/null
    echo "gpu_session: packed $OUT into $PACK/gpu-session.tar.gz ($(du -h "$PACK/gpu-session.tar.gz" | cut -f1))"
}
if [ -n "${PACK:-}" ]; then
    case "$(realpath -m "$PACK")/" in "$(realpath -m "$OUT")"/*)
        echo "gpu_session: PACK ($PACK) must not be inside OUT ($OUT)" >&2; exit 2 ;;
    esac
fi
trap pack EXIT
stopped() {  # TERM/INT: stop the step that was running and record it, then exit (and pack)
    [ -n "${CURRENT:-}" ] && [ -n "${STEP_PID:-}" ] && kill -TERM "$STEP_PID" 2>/dev/null  # timeout passes it on
    log "gpu_session: stopped by a signal during ${CURRENT:-no step}"
    [ -n "${CURRENT:-}" ] && printf '%s\t%s\t%s\n' "$CURRENT" "signal" "$((SECONDS - STEP_START))" >> "$OUT/steps.tsv"
    exit 1
}
trap stopped TERM INT

# run_step NAME LIMIT_SECONDS COMMAND...: output to logs/NAME.log, status to steps.tsv
run_step() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    if [ "$limit" -le 5 ]; then
        log "== $name: skipped (session time is spent)"
        printf '%s\t%s\t%s\n' "$name" "skipped" 0 >> "$OUT/steps.tsv"
        FAILED="$FAILED $name"
        return 0
    fi
    CURRENT=$name STEP_START=$start STEP_PID=""
    log "== $name (limit ${limit}s): $*"
    if [ "$(type -t "$1")" = function ]; then set -- bash -c '"$@"' "$name" "$@"; fi  # timeout runs programs
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1 &
    STEP_PID=$!
    wait $STEP_PID  # in the background, so that a TERM reaches the trap (and the packing) at once
    rc=$?
    CURRENT=""
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.tsv"
    tail -n 4 "$OUT/logs/$name.log" | sed 's/^/   /' | tee -a "$OUT/session.log"
    log "   -> exit $rc after $((SECONDS - start)) s$([ $rc -eq 124 ] && echo ' (timed out)')"
    [ $rc -eq 0 ] || FAILED="$FAILED $name"
    return 0
}

# Seconds left for a step: its own cap, or what remains of the session minus RESERVE.
# (Caps and reserves are scaled by SCALE, as TOTAL is.)
left() { local cap=$(($1 * SCALE)) rest=$((TOTAL - SECONDS - ${2:-0} * SCALE)); echo $((rest < cap ? rest : cap)); }

# STEPS: the steps to run (all by default); one device call cannot hold all of them at full size.
ALL_STEPS="versions install gpu-tests tests demo train bench fp8 sound profile serve scaling gpu-aoti"
SMOKE_STEPS="versions install gpu-tests tests demo train bench"  # the GPU-only measurements left out
if [ "$SMOKE" = 1 ]; then STEPS=${STEPS:-$SMOKE_STEPS}; else STEPS=${STEPS:-$ALL_STEPS}; fi
for step in $STEPS; do
    case " $ALL_STEPS " in *" $step "*) ;; *) echo "gpu_session: unknown step '$step' in STEPS (steps: $ALL_STEPS)" >&2; exit 2 ;; esac
done
wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# kept STEP...: the seconds an earlier step leaves for these later steps, those wanted
declare -A SHARE=([tests]=100 [demo]=45 [train]=35 [bench]=150 [fp8]=60 [sound]=45 [profile]=35 [serve]=45
                  [scaling]=45 [gpu-aoti]=60)
kept() { local sum=0 step; for step in "$@"; do wanted "$step" && sum=$((sum + SHARE[$step])); done; echo $sum; }

versions() {
    "$PY" - <<'EOF'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "triton", "timm", "onnx", "onnxruntime", "tensorrt", "numpy"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except ImportError:
        print(name, "not installed")
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
try:
    import onnxruntime
    print("onnxruntime providers", onnxruntime.get_available_providers())
except ImportError:
    pass
EOF
    if command -v nvidia-smi > /dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
    # AOTInductor builds CUDA packages with the CUDA toolkit's headers (CUDA_HOME, or nvcc's folder)
    "$PY" -c "import torch.utils.cpp_extension as e; print('CUDA_HOME', e.CUDA_HOME)" 2>&1 | tail -n 1
    echo "nvcc $(command -v nvcc || echo 'not found'); gcc $(command -v gcc || echo 'not found')"
}

install() {
    "$PY" -m pip install --no-deps --no-build-isolation -e . && "$PY" -c "import dmae_fast.bench, dmae_fast.export"
}

# Where pip cannot install (offline, old setuptools): the same package layout as pyproject's
# package-dir mapping, made of symbolic links, on PYTHONPATH.
shim() {
    local root=$SCRATCH/shim/dmae_fast
    mkdir -p "$root"
    for f in "$PWD"/dmae_fast/*; do ln -sfn "$f" "$root/"; done
    for d in kernels export train bench; do ln -sfn "$PWD/$d" "$root/$d"; done
    export PYTHONPATH="$SCRATCH/shim${PYTHONPATH:+:$PYTHONPATH}"
    log "   using the PYTHONPATH shim $SCRATCH/shim"
}

pytest_step() {  # NAME LIMIT pytest-arguments...
    local name=$1 limit=$2
    shift 2
    run_step "$name" "$limit" "$PY" -m pytest -v -p no:cacheprovider --junitxml="$OUT/tests/$name.xml" "$@"
}

demo_check() {  # fp32 counts on CUDA must equal this machine's CPU counts (same seed)
    local gpu=cuda max=5 n=1000
    [ "$SMOKE" = 1 ] && { gpu=cpu; max=1; n=30; }
    local common=(--data demo --max "$max" --n0 100 --n "$n" --precision fp32 --quiet --overwrite --workers 0 --seed 0)
    # the CPU side with the torch-op reference noise (no compile): the contract across implementations
    "$PY" -m dmae_fast.cli.certify "${common[@]}" --device cpu --noise reference --out "$OUT/demo/cpu.tsv" &&
        "$PY" -m dmae_fast.cli.certify "${common[@]}" --device "$gpu" --out "$OUT/demo/gpu.tsv" &&
        "$PY" -m dmae_fast.bench.compare_counts "$OUT/demo/cpu.tsv" "$OUT/demo/gpu.tsv" || return 1
}

fp8_check() {  # top-1 agreement with fp16; the demo certified in fp16 and in fp8 (same seed, --fast)
    "$PY" bench/experiments/fp8_agreement.py --out "$OUT/fp8" || return 1
    local precision
    for precision in fp16 fp8; do
        "$PY" -m dmae_fast.cli.certify --data demo --max 100 --n0 100 --n 10000 --precision "$precision" --fast \
            --quiet --overwrite --out "$OUT/fp8/demo-$precision.tsv" &&
            "$PY" -m dmae_fast.cli.certify analyze "$OUT/fp8/demo-$precision.tsv" > "$OUT/fp8/demo-$precision.md" ||
            return 1
    done
}

# scaling: 1 and 2 processes sharing GPU 0 (image claiming through the store), then sample
# sharding with 2 processes on it (counts all-reduced over NCCL)
scaling() {
    "$PY" -m dmae_fast.cli.bench scaling --procs 1 2 --rounds 1 --threads 0 --out "$OUT/scaling" -- \
        --data demo --max 40 --n 10000 --device cuda:0 --workers 0
    local first=$?
    "$PY" -m dmae_fast.cli.certify --nproc-per-node 2 --shard samples --device cuda:0 --data demo --max 4 \
        --n 10000 --quiet --overwrite --workers 0 --out "$OUT/scaling/shard-samples.tsv" || return 1
    return $first
}

if [ -n "${WHEELS:-}" ] && [ "$SMOKE" != 1 ]; then  # packages the machine lacks (no network there)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SCRATCH/site" \
        "$WHEELS"/*.whl && export PYTHONPATH="$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}"
fi

export OUT PY SMOKE SCRATCH
export -f versions install demo_check fp8_check scaling
log "gpu_session: OUT=$OUT SCRATCH=$SCRATCH SESSION_SECONDS=$TOTAL smoke=$SMOKE steps=$STEPS $(date -u +%FT%TZ)"
wanted versions && run_step versions $((30 * SCALE)) versions

if [ "$SMOKE" = 1 ]; then
    shim
elif wanted install; then
    run_step install "$(left 60)" install
    case "$FAILED" in *install*) shim ;; esac
fi

# The test files that hold GPU tests (tests/test_bench.py checks that none is missing). The .pt2
# tests run last, in their own step: loading an AOTInductor package crashed the process on an H200
# and on an H100 (segmentation fault, torch 2.11; a CPU package too), which took the GPU tests after
# it down too.
GPU_TEST_FILES=(tests/test_stream.py tests/test_fast_stream.py tests/test_kernels.py tests/test_fp8.py tests/test_gelu_quantize.py tests/test_sound_kernel.py tests/test_cpp.py)
AOTI_TESTS=(tests/test_fast_stream.py::test_fused_front_end_feeds_a_cuda_pt2_token_engine_under_a_cuda_graph tests/test_cpp.py::test_cuda_package_rows_equal_dmae_certify_on_the_gpu_and_the_cpu_counts)
DESELECT=()
for test in "${AOTI_TESTS[@]}"; do DESELECT+=(--deselect "$test"); done
if [ "$SMOKE" = 1 ]; then  # one quick module: its GPU test is collected and skipped
    wanted gpu-tests && pytest_step gpu-tests "$(left 60)" -m gpu tests/test_stream.py
else
    wanted gpu-tests && pytest_step gpu-tests "$(left 200 "$(kept tests demo train bench fp8 sound profile serve scaling gpu-aoti)")" \
        -m gpu "${DESELECT[@]}" "${GPU_TEST_FILES[@]}"
    wanted tests && pytest_step tests "$(left 150 "$(kept demo train bench fp8 sound profile serve scaling gpu-aoti)")" -m "not gpu" tests/test_kernels.py \
        tests/test_stream.py tests/test_fast_stream.py tests/test_engines.py tests/test_export.py
fi
wanted demo && run_step demo "$(left 90 "$(kept train bench fp8 sound profile serve scaling gpu-aoti)")" demo_check  # three processes, each compiling

if [ "$SMOKE" = 1 ]; then
    TRAIN=(--preset demo-pretrain --batch 16 --seconds 0.5 --device cpu)
else
    TRAIN=(--preset dmae-vitb-pretrain --batch 256 --precision bf16 --seconds 20)
fi
wanted train && run_step train "$(left 75 "$(kept bench fp8 sound profile serve scaling gpu-aoti)")" "$PY" -m dmae_fast.bench.train_throughput "${TRAIN[@]}" \
    --out "$OUT/train"

if [ "$SMOKE" = 1 ]; then
    BENCH=(--smoke --models tiny-cpu --batches 16 --seconds 0.1)
else
    read -r -a BENCH <<< "${BENCH_ARGS:---all --models vit-b16 --export-models demo vit-b16 --batches 256 1024 --seconds 2 --reference-budget 8 --images 10}"
fi
if wanted bench; then
    BENCH_LIMIT=$(left 900 $((15 + $(kept fp8 sound profile serve scaling gpu-aoti))))
    BUDGET=$((BENCH_LIMIT - 25 > 30 ? BENCH_LIMIT - 25 : 30))  # margin for a row or export that overruns
    [ "$SMOKE" = 1 ] && BUDGET=120  # the bench's own budget: it stops early, it does not fail
    ENGINE_DIR=(--engine-dir "$SCRATCH")  # exported engines stay behind (too large to bring back)
    [[ " ${BENCH[*]} " =~ " --export-models "(--|$) ]] && ENGINE_DIR=()  # no exports: no engine folder
    run_step bench "$BENCH_LIMIT" "$PY" -m dmae_fast.cli.bench "${BENCH[@]}" --out "$OUT/bench" --budget "$BUDGET" \
        "${ENGINE_DIR[@]}"
    find "$SCRATCH" -maxdepth 2 -name '*.json' -path '*-engines/*' -exec cp {} "$OUT/bench/engines/" \; 2>/dev/null
fi

wanted fp8 && run_step fp8 "$(left 120 "$(kept sound profile serve scaling gpu-aoti)")" fp8_check
# --sound against the default noise on the same body (issue 37): ViT-B/16 fp16, fast and plain bodies
read -r -a SOUND <<< "${SOUND_ARGS:---models vit-b16 --images 4 --n 2000 --rounds 2}"
wanted sound && run_step sound "$(left 120 "$(kept profile serve scaling gpu-aoti)")" "$PY" \
    bench/experiments/2026-11-27-sound/sound_speed.py --device cuda "${SOUND[@]}" --out "$OUT/sound"
read -r -a PROFILE <<< "${PROFILE_ARGS:---model vit-b16 --batch 1024}"
wanted profile && run_step profile "$(left 120 "$(kept serve scaling gpu-aoti)")" "$PY" bench/experiments/gpu_profile.py \
    "${PROFILE[@]}" --out "$OUT/profile"
read -r -a SERVE <<< "${SERVE_ARGS:---batch 2000 --n 500 --rounds 2 --saturation-seconds 3 --seconds 5 --max-wait-ms 0 5 20 --loads 0.5 0.9}"
wanted serve && run_step serve "$(left 150 "$(kept scaling gpu-aoti)")" "$PY" -m dmae_fast.cli.bench serve --device cuda \
    "${SERVE[@]}" --out "$OUT/serve"
wanted scaling && run_step scaling "$(left 150 "$(kept gpu-aoti)")" scaling
# dmae-fast refuses .pt2 on torch < 2.12 (the load crashed on 2.11); this last step tries it anyway, to diagnose
[ "$SMOKE" != 1 ] && wanted gpu-aoti && DMAE_FAST_TRY_AOTI=1 pytest_step gpu-aoti "$(left 150)" -m gpu "${AOTI_TESTS[@]}"

log "gpu_session: done in ${SECONDS}s; failed steps:${FAILED:- none}"
cp "$OUT/steps.tsv" "$OUT/logs/" 2>/dev/null
[ -z "$FAILED" ]
