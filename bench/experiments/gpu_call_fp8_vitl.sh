#!/usr/bin/env bash
# The second device call of 2026-11-26 (H200): what the first (bench/gpu_session.sh) left open.
#   OUT=<folder> bash bench/experiments/gpu_call_fp8_vitl.sh    -> OUT/gpu-call.tar.gz
# 1. the fp8 GPU test; 2. the demo certified in fp8 (--fast; fp16 was certified in the first call);
# 3. the profile of the compiled fp8 ViT-B body; 4. ViT-L/16 throughput rows (references, eager and
# fused + compiled + CUDA graphs in fp16 and fp8); 5. ViT-B fused + compiled + CUDA graphs fp16 in
# the compile mode --fast uses (max-autotune-no-cudagraphs). Results are packed after every step,
# so a step cut by the lease keeps what came before it.
. "$(dirname "$0")/gpu_call_steps.sh"
certify_fp8() {
    "$PY" -m dmae_fast.cli.certify --data demo --max 100 --n0 100 --n 10000 --precision fp8 --fast --quiet \
        --overwrite --out "$R/demo-fp8.tsv" && "$PY" -m dmae_fast.cli.certify analyze "$R/demo-fp8.tsv" > "$R/demo-fp8.md"
}
export -f certify_fp8
step install 60 "$PY" -m pip install --no-deps --no-build-isolation -e .
step fp8-test 45 "$PY" -m pytest -v -p no:cacheprovider -m gpu tests/test_fp8.py
step demo-fp8 55 bash -c certify_fp8
step profile-fp8 45 "$PY" bench/experiments/gpu_profile.py --model vit-b16 --batch 1024 --compile --precision fp8 \
    --out "$R/profile"
THROUGHPUT=(--export-models --batches 1024 --main-batch 1024 --seconds 2)
step bench-vit-l 140 "$PY" -m dmae_fast.cli.bench throughput --models vit-l16 --variants eager fused+compiled+graphs \
    --precisions fp16 fp8 --budget 130 "${THROUGHPUT[@]}" --out "$R/bench-vit-l"
step bench-autotune 100 "$PY" -m dmae_fast.cli.bench throughput --models vit-b16 --variants fused+compiled+graphs \
    --precisions fp16 --compile-mode max-autotune-no-cudagraphs --budget 90 "${THROUGHPUT[@]}" --out "$R/bench-autotune"
