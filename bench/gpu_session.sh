#!/usr/bin/env bash
# One-call GPU session: install, check and measure on a fresh GPU machine, the most valuable first.
#
#   OUT=/path/for/results bash bench/gpu_session.sh          # from the repository root
#   PACK=$OUT OUT=/tmp/gpu-session bash bench/gpu_session.sh  # in the device tool (PACK: its $OUT)
#
# The default steps (one device call of at most 9 minutes: SESSION_SECONDS=540, the budgets below add up
# to it; bench/results/2026-12-02-gpu-session-plan/README.md says where each budget comes from):
#
#   step        budget  what (-> its results under $OUT)
#   versions      20 s  Python, torch, triton, ... versions, nvidia-smi (logs/versions.log)
#   install       15 s  pip install --no-deps --no-build-isolation -e . (else a PYTHONPATH shim)
#   body          95 s  the ViT-B/16 body (fused + compiled + CUDA graphs, batch 1024) in fp8, bf16, fp16 and the
#                       two reference loops, as dmae-bench throughput measures them (body/throughput.json)
#   certify       90 s  CERTIFY (n0 100, n 10,000, fp8) over 64 images of dmae-bench certify's population
#                       (certify/certify.json)
#   sequential    85 s  what --sequential runs over 1,000 images, drawn samples/s vs fixed-n on the same body,
#                       the device's idle time and the rows drawn but unused (sequential/sequential.json)
#   sound         70 s  --sound against the default noise on the same ViT-B body (sound/sound-speed.json)
#   vit-l         45 s  the ViT-L/16 body in fp8 (fp16 if time is left) (vit-l/throughput.json)
#   serve         55 s  dmae-bench serve on CUDA: the server at saturation vs the offline streamer (serve/)
#   train         20 s  DMAE ViT-B pre-training images/s in bf16 (train/)
#   gpu-aoti      45 s  the .pt2 GPU tests and dmae-smooth on the GPU (AOTI_TESTS, DMAE_FAST_TRY_AOTI=1), last
#                       and alone (the load crashed the process on torch 2.11); it also gets what the steps
#                       before it left unused, up to 150 s (tests/gpu-aoti.xml)
#
# A step runs under `timeout` with min(its budget, what is left of SESSION_SECONDS less gpu-aoti's 45 s); one
# left less than a third of its budget is skipped, so the time goes to the next. The measurement drivers
# (bench/experiments/2026-12-02-gpu-session/measure.py) stop by a deadline 8 s before their limit and write
# their results after every row. Further steps, not in the default list (STEPS= asks for them; a checks call:
# STEPS="versions install gpu-tests tests demo"): gpu-tests (pytest -m gpu on the files with GPU tests, the
# .pt2 tests left out), tests (the stream, engine and export tests on this machine), demo (dmae-certify fp32
# on the demo digits: CUDA counts must equal this machine's CPU counts), bench (dmae-bench, BENCH_ARGS), fp8
# (fp8's top-1 agreement with fp16 and the demo certified in both), profile (a ViT-B batch's kernels),
# scaling (dmae-bench scaling, 1 and 2 processes on GPU 0, then --shard samples). Every dmae-certify whose rows
# are compared passes --seed 0.
#
# Every step, also one that fails, times out or is skipped, writes results/<step>.json (status, seconds, its
# headline or the failure's one line, its results files, the log's tail) and appends one line to summary.tsv:
#   step <TAB> ok|failed|skipped <TAB> seconds <TAB> headline (the step's figure, or the failure's one line)
# Also: steps.tsv (step, exit status, seconds), session.log, logs/<step>.log, tests/*.xml (junit).
# Exit status: 0 if every step passed, else 1 (the failed steps are listed at the end).
# PACK=<folder> (e.g. the device tool's $OUT, which brings back 8 files at most): on exit, even after a failed
# step or a TERM/INT, everything under $OUT is packed into PACK/gpu-session.tar.gz, and summary.tsv,
# session.log and steps.tsv are copied beside it (4 files).
# Environment: STEPS (default: the steps above), SESSION_SECONDS (default 540: the whole script), PYTHON
# (default python3), WHEELS (a folder of wheels that the machine lacks, installed with --no-deps into
# SCRATCH/site on PYTHONPATH, e.g. .whl), BODY_ARGS, CERTIFY_ARGS, SEQUENTIAL_ARGS, VITL_ARGS (measure.py's
# arguments), SOUND_ARGS, SERVE_ARGS, TRAIN_ARGS, BENCH_ARGS, PROFILE_ARGS (defaults below), SCRATCH (default
# a temporary folder: exported engines, too large to bring back), GPU_SESSION_SMOKE=1 (CPU smoke sizes, no
# install, the default steps but sound and serve (SMOKE_STEPS; gpu-aoti's tests are collected and skipped
# for want of CUDA): the test that keeps this script working, tests/test_bench.py; there every budget and
# SESSION_SECONDS are multiplied by LIMIT_SCALE, default 10: on a CPU the limits only guard against hangs, and
# a busy machine must not fail the smoke run).
set -u

: "${OUT:?set OUT to the folder for the results}"
PY=${PYTHON:-python3}
SMOKE=${GPU_SESSION_SMOKE:-0}
if [ "$SMOKE" = 1 ]; then SCALE=${LIMIT_SCALE:-10}; else SCALE=${LIMIT_SCALE:-1}; fi
TOTAL=$((${SESSION_SECONDS:-540} * SCALE))
SCRATCH=${SCRATCH:-$(mktemp -d)}
TOOLS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/experiments/2026-12-02-gpu-session  # measure.py, summary.py
mkdir -p "$OUT/logs" "$OUT/tests" "$OUT/results" "$OUT/bench/engines" "$SCRATCH"
FAILED=""
SECONDS=0

log() { echo "$*" | tee -a "$OUT/session.log"; }

# pack: $OUT -> $PACK/gpu-session.tar.gz (+ summary.tsv, session.log, steps.tsv), once, on any exit
pack() {
    [ -n "${PACK:-}" ] && [ -z "${PACKED:-}" ] || return 0
    PACKED=1
    mkdir -p "$PACK" && tar -czf "$PACK/gpu-session.tar.gz" -C "$OUT" . &&
        cp "$OUT/summary.tsv" "$OUT/session.log" "$OUT/steps.tsv" "$PACK/" 2>/dev/null
    echo "gpu_session: packed $OUT into $PACK/gpu-session.tar.gz ($(du -h "$PACK/gpu-session.tar.gz" | cut -f1))"
}
if [ -n "${PACK:-}" ]; then
    case "$(realpath -m "$PACK")/" in "$(realpath -m "$OUT")"/*)
        echo "gpu_session: PACK ($PACK) must not be inside OUT ($OUT)" >&2; exit 2 ;;
    esac
fi
trap pack EXIT

# summarize NAME STATUS SECONDS LIMIT: results/NAME.json and one line of summary.tsv (summary.py reads files only)
summarize() {
    local line
    line=$("$PY" "$TOOLS/summary.py" "$@" "$OUT" 2>> "$OUT/logs/summary-errors.log") ||
        line=$(printf '%s\t%s\t%s\t%s' "$1" "$([ "$2" = 0 ] && echo ok || echo failed)" "$3" \
            "exit $2: $(grep -v '^\s*$' "$OUT/logs/$1.log" 2>/dev/null | tail -n 1 | cut -c1-300) (summary.py failed)")
    printf '%s\n' "$line" >> "$OUT/summary.tsv"
    log "   summary: $line"
}
stopped() {  # TERM/INT: stop the step that was running and record it, then exit (and pack)
    [ -n "${CURRENT:-}" ] && [ -n "${STEP_PID:-}" ] && kill -TERM "$STEP_PID" 2>/dev/null  # timeout passes it on
    log "gpu_session: stopped by a signal during ${CURRENT:-no step}"
    if [ -n "${CURRENT:-}" ]; then
        printf '%s\t%s\t%s\n' "$CURRENT" "signal" "$((SECONDS - STEP_START))" >> "$OUT/steps.tsv"
        summarize "$CURRENT" signal "$((SECONDS - STEP_START))" "${STEP_LIMIT:-0}"
    fi
    exit 1
}
trap stopped TERM INT

# run_step NAME LIMIT_SECONDS COMMAND...: output to logs/NAME.log, status to steps.tsv, a line to summary.tsv.
# Skipped when LIMIT is under a third of the step's budget (or 6 s): the time goes to the next step.
run_step() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    local least=$(( ${BUDGET[$name]:-0} * SCALE / 3 > 6 ? ${BUDGET[$name]:-0} * SCALE / 3 : 6 ))
    if [ "$limit" -lt "$least" ]; then
        log "== $name: skipped ($limit s of the session left, it needs $least s or more)"
        printf '%s\t%s\t%s\n' "$name" "skipped" 0 >> "$OUT/steps.tsv"
        summarize "$name" skipped 0 "$limit"
        FAILED="$FAILED $name"
        return 0
    fi
    CURRENT=$name STEP_START=$start STEP_LIMIT=$limit STEP_PID=""
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
    summarize "$name" "$rc" "$((SECONDS - start))" "$limit"
    [ $rc -eq 0 ] || FAILED="$FAILED $name"
    return 0
}

pytest_step() {  # NAME LIMIT pytest-arguments...
    local name=$1 limit=$2
    shift 2
    run_step "$name" "$limit" "$PY" -m pytest -v -p no:cacheprovider --junitxml="$OUT/tests/$name.xml" "$@"
}

# The steps: DEFAULT_STEPS in one 9-minute call, the others on request; all run in ORDER.
DEFAULT_STEPS="versions install body certify sequential sound vit-l serve train gpu-aoti"
ORDER="versions install gpu-tests tests demo body certify sequential sound vit-l serve train bench fp8 profile scaling gpu-aoti"
# Seconds per step (SCALE times on a CPU). Default steps: from the last GPU runs' durations with a margin,
# adding up to SESSION_SECONDS' 540 (the plan's README); the others as before (they do not fit one call).
declare -A BUDGET=([versions]=20 [install]=15 [body]=95 [certify]=90 [sequential]=85 [sound]=70 [vit-l]=45
                   [serve]=55 [train]=20 [gpu-aoti]=45 [gpu-tests]=200 [tests]=150 [demo]=90 [bench]=150 [fp8]=120
                   [profile]=60 [scaling]=150)
AOTI_MOST=150  # gpu-aoti: its budget is kept for it, and it takes what the steps before it left, up to this
# The smoke run (tests/test_bench.py) leaves out sound and serve, as before (their CPU sizes run when STEPS
# names them: 13 and 30 s of a 109 s smoke run on 2 busy cores, bench/results/2026-12-02-gpu-session-plan)
SMOKE_STEPS="versions install body certify sequential vit-l train gpu-aoti"
if [ "$SMOKE" = 1 ]; then STEPS=${STEPS:-$SMOKE_STEPS}; else STEPS=${STEPS:-$DEFAULT_STEPS}; fi
for step in $STEPS; do
    case " $ORDER " in *" $step "*) ;; *) echo "gpu_session: unknown step '$step' in STEPS (steps: $ORDER)" >&2; exit 2 ;; esac
done
wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# limit STEP: its budget, or what is left of the session less gpu-aoti's budget (kept for it: it runs last
# for safety, not for its value); gpu-aoti itself: what is left, up to AOTI_MOST
limit() {
    local step=$1 cap keep=0 rest
    cap=$(( ${BUDGET[$step]} * SCALE ))
    if [ "$step" = gpu-aoti ]; then cap=$((AOTI_MOST * SCALE)); elif wanted gpu-aoti; then keep=$(( ${BUDGET[gpu-aoti]} * SCALE )); fi
    rest=$((TOTAL - SECONDS - keep))
    echo $((rest < cap ? rest : cap))
}
deadline() { echo $(($1 - 8 * SCALE)); }  # a driver's own deadline: its results are written before the limit

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
# AOTInductor builds CUDA packages with the CUDA toolkit's headers (CUDA_HOME, or nvcc's folder); its warnings muted
import contextlib, io, warnings
with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch.utils.cpp_extension as extension
print("CUDA_HOME", extension.CUDA_HOME)
EOF
    if command -v nvidia-smi > /dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
    echo "nvcc $(command -v nvcc || echo 'not found'); gcc $(command -v gcc || echo 'not found')"
}

install() {
    if [ "$SMOKE" = 1 ]; then echo "smoke run: no pip install; the PYTHONPATH shim $SCRATCH/shim"; return 0; fi
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
            --seed 0 --quiet --overwrite --out "$OUT/fp8/demo-$precision.tsv" &&
            "$PY" -m dmae_fast.cli.certify analyze "$OUT/fp8/demo-$precision.tsv" > "$OUT/fp8/demo-$precision.md" ||
            return 1
    done
}

# scaling: 1 and 2 processes sharing GPU 0 (image claiming through the store; rows compared: --seed 0),
# then sample sharding with 2 processes on it (counts all-reduced over NCCL)
scaling() {
    "$PY" -m dmae_fast.bench.command scaling --procs 1 2 --rounds 1 --threads 0 --out "$OUT/scaling" -- \
        --data demo --max 40 --n 10000 --seed 0 --device cuda:0 --workers 0
    local first=$?
    "$PY" -m dmae_fast.cli.certify --nproc-per-node 2 --shard samples --device cuda:0 --data demo --max 4 \
        --n 10000 --seed 0 --quiet --overwrite --workers 0 --out "$OUT/scaling/shard-samples.tsv" || return 1
    return $first
}

if [ -n "${WHEELS:-}" ] && [ "$SMOKE" != 1 ]; then  # packages the machine lacks (no network there)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SCRATCH/site" \
        "$WHEELS"/*.whl && export PYTHONPATH="$SCRATCH/site${PYTHONPATH:+:$PYTHONPATH}"
fi

export OUT PY SMOKE SCRATCH
export -f versions install demo_check fp8_check scaling
log "gpu_session: OUT=$OUT SCRATCH=$SCRATCH SESSION_SECONDS=$TOTAL smoke=$SMOKE steps=$STEPS $(date -u +%FT%TZ)"
printf 'step\tstatus\tseconds\theadline\n' > "$OUT/summary.tsv"
wanted versions && run_step versions "$(limit versions)" versions

[ "$SMOKE" = 1 ] && shim  # the smoke run installs nothing
if wanted install; then
    run_step install "$(limit install)" install
    [ "$SMOKE" != 1 ] && case "$FAILED" in *install*) shim ;; esac
fi

# The test files that hold GPU tests (tests/test_bench.py checks that none is missing). The .pt2
# tests run last, in their own step: loading an AOTInductor package crashed the process on an H200
# and on an H100 (segmentation fault, torch 2.11; a CPU package too), which took the GPU tests after
# it down too.
GPU_TEST_FILES=(tests/test_stream.py tests/test_fast_body.py tests/test_kernels.py tests/test_fp8.py tests/test_gelu_quantize.py tests/test_sound_kernel.py tests/test_cpp.py)
AOTI_TESTS=(tests/test_fast_body.py::test_fused_front_end_feeds_a_cuda_pt2_token_engine_under_a_cuda_graph tests/test_cpp.py::test_cuda_package_rows_equal_dmae_certify_on_the_gpu_and_the_cpu_counts)
DESELECT=()
for test in "${AOTI_TESTS[@]}"; do DESELECT+=(--deselect "$test"); done
if [ "$SMOKE" = 1 ]; then  # one quick module: its GPU test is collected and skipped
    wanted gpu-tests && pytest_step gpu-tests "$(limit gpu-tests)" -m gpu tests/test_stream.py
else
    wanted gpu-tests && pytest_step gpu-tests "$(limit gpu-tests)" -m gpu "${DESELECT[@]}" "${GPU_TEST_FILES[@]}"
    wanted tests && pytest_step tests "$(limit tests)" -m "not gpu" tests/test_kernels.py tests/test_stream.py \
        tests/test_fast_body.py tests/test_engines.py tests/test_export.py
fi
wanted demo && run_step demo "$(limit demo)" demo_check  # three processes, each compiling

# The measurements (measure.py: the bench's own functions, each row written as it ends, a deadline)
MEASURE=("$PY" "$TOOLS/measure.py")
if [ "$SMOKE" = 1 ]; then  # CPU sizes: every stage runs, nothing about speed is claimed
    TINY=(--model tiny-cpu --device cpu)
    BODY_DEFAULT="${TINY[*]} --batch 16 --seconds 0.05 --peak-seconds 0.1"
    CERTIFY_DEFAULT="${TINY[*]} --batch 64 --images 4 --n0 20 --n 200"
    SEQUENTIAL_DEFAULT="${TINY[*]} --batch 64 --images 8 --n0 20 --n 200"
    VITL_DEFAULT="${TINY[*]} --batch 16 --seconds 0.05 --peak-seconds 0.1 --no-references"
    SOUND_DEFAULT="--device cpu --models tiny-cpu --images 2 --n 100 --rounds 1"
    SERVE_DEFAULT="--device cpu --quick --max-wait-ms 5"
    TRAIN_DEFAULT="--preset demo-pretrain --batch 16 --seconds 0.5 --device cpu"
    BENCH_DEFAULT="--smoke --models tiny-cpu --batches 16 --seconds 0.1"
else
    BODY_DEFAULT="--model vit-b16 --precisions fp8 bf16 fp16 --batch 1024 --seconds 2 --row-seconds 25"
    CERTIFY_DEFAULT="--model vit-b16 --precision fp8 --batch 1024 --images 64 --n0 100 --n 10000"
    SEQUENTIAL_DEFAULT="--model vit-b16 --precision fp8 --batch 1024 --images 1000 --n0 100 --n 10000"
    VITL_DEFAULT="--model vit-l16 --precisions fp8 fp16 --batch 1024 --seconds 2 --row-seconds 30 --no-references"
    SOUND_DEFAULT="--device cuda --models vit-b16 --images 2 --n 1000 --rounds 1"
    SERVE_DEFAULT="--device cuda --batch 2000 --n 500 --rounds 1 --saturation-seconds 2 --seconds 2 --max-wait-ms 5 --loads 0.5"
    TRAIN_DEFAULT="--preset dmae-vitb-pretrain --batch 256 --precision bf16 --seconds 4"
    BENCH_DEFAULT="--all --models vit-b16 --export-models demo vit-b16 --batches 256 1024 --seconds 2 --reference-budget 8 --images 10"
fi
read -r -a BODY <<< "${BODY_ARGS:-$BODY_DEFAULT}"
read -r -a CERTIFY <<< "${CERTIFY_ARGS:-$CERTIFY_DEFAULT}"
read -r -a SEQUENTIAL <<< "${SEQUENTIAL_ARGS:-$SEQUENTIAL_DEFAULT}"
read -r -a VITL <<< "${VITL_ARGS:-$VITL_DEFAULT}"
read -r -a SOUND <<< "${SOUND_ARGS:-$SOUND_DEFAULT}"
read -r -a SERVE <<< "${SERVE_ARGS:-$SERVE_DEFAULT}"
read -r -a TRAIN <<< "${TRAIN_ARGS:-$TRAIN_DEFAULT}"
read -r -a BENCH <<< "${BENCH_ARGS:-$BENCH_DEFAULT}"

# (a) the ViT-B body: fp8, bf16, fp16 and the reference loops, each row's wall time recorded
if wanted body; then L=$(limit body)
    run_step body "$L" "${MEASURE[@]}" throughput "${BODY[@]}" --deadline "$(deadline "$L")" --out "$OUT/body"; fi
# (b) CERTIFY over 64 images (fixed-n, the paper's n0 and n), the compile cached by (a)
if wanted certify; then L=$(limit certify)
    run_step certify "$L" "${MEASURE[@]}" certify "${CERTIFY[@]}" --deadline "$(deadline "$L")" --out "$OUT/certify"; fi
# (c) --sequential over 1,000 images; fixed-n's samples/s of the same body from (b) (else measured there)
if wanted sequential; then L=$(limit sequential)
    run_step sequential "$L" "${MEASURE[@]}" sequential "${SEQUENTIAL[@]}" --fixed "$OUT/certify/certify.json" \
        --deadline "$(deadline "$L")" --out "$OUT/sequential"; fi
# (d) --sound against the default noise on the same body (issue 37): ViT-B/16 fp16, fast and plain bodies
wanted sound && run_step sound "$(limit sound)" "$PY" bench/experiments/2026-11-27-sound/sound_speed.py "${SOUND[@]}" \
    --out "$OUT/sound"
# (f) ViT-L/16
if wanted vit-l; then L=$(limit vit-l)
    run_step vit-l "$L" "${MEASURE[@]}" throughput "${VITL[@]}" --deadline "$(deadline "$L")" --out "$OUT/vit-l"; fi
# (g) dmae-serve at saturation and under load
wanted serve && run_step serve "$(limit serve)" "$PY" -m dmae_fast.bench.command serve "${SERVE[@]}" --out "$OUT/serve"
# (h) pre-training images/s
wanted train && run_step train "$(limit train)" "$PY" -m dmae_fast.bench.train_throughput "${TRAIN[@]}" --out "$OUT/train"

if wanted bench; then  # dmae-bench as it is (not in the default steps)
    L=$(limit bench)
    BUDGET_S=$((L - 25 * SCALE > 30 ? L - 25 * SCALE : 30))  # margin for a row or export that overruns
    [ "$SMOKE" = 1 ] && BUDGET_S=120  # the bench's own budget: it stops early, it does not fail
    ENGINE_DIR=(--engine-dir "$SCRATCH")  # exported engines stay behind (too large to bring back)
    [[ " ${BENCH[*]} " =~ " --export-models "(--|$) ]] && ENGINE_DIR=()  # no exports: no engine folder
    run_step bench "$L" "$PY" -m dmae_fast.bench.command "${BENCH[@]}" --out "$OUT/bench" --budget "$BUDGET_S" \
        "${ENGINE_DIR[@]}"
    find "$SCRATCH" -maxdepth 2 -name '*.json' -path '*-engines/*' -exec cp {} "$OUT/bench/engines/" \; 2>/dev/null
fi
wanted fp8 && run_step fp8 "$(limit fp8)" fp8_check
read -r -a PROFILE <<< "${PROFILE_ARGS:---model vit-b16 --batch 1024}"
wanted profile && run_step profile "$(limit profile)" "$PY" bench/experiments/gpu_profile.py "${PROFILE[@]}" \
    --out "$OUT/profile"
wanted scaling && run_step scaling "$(limit scaling)" scaling
# (e) .pt2 on the GPU and dmae-smooth there: last and alone (the load crashed the process on torch 2.11).
# dmae-fast refuses .pt2 on torch < 2.12; DMAE_FAST_TRY_AOTI=1 tries anyway, to diagnose. (On a CPU its
# tests are collected and skipped.)
wanted gpu-aoti && DMAE_FAST_TRY_AOTI=1 pytest_step gpu-aoti "$(limit gpu-aoti)" -m gpu "${AOTI_TESTS[@]}"

log "gpu_session: done in ${SECONDS}s; failed steps:${FAILED:- none}"
cp "$OUT/steps.tsv" "$OUT/summary.tsv" "$OUT/logs/" 2>/dev/null
[ -z "$FAILED" ]
