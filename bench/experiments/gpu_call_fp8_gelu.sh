#!/usr/bin/env bash
# A device call of 2026-11-26 (third GPU session): the fp8 body with GELU fused into the per-row
# quantization of fc2's input (dmae_fast.kernels.gelu_quantize), measured against fp16 and bf16.
#   OUT=<folder> bash bench/experiments/gpu_call_fp8_gelu.sh    -> OUT/gpu-call.tar.gz
# 1. the fp8 GPU tests (kernel vs reference, eager and compiled; the fast fp8 body vs fp16);
# 2. ViT-B/16 throughput: references, fused + compiled + CUDA graphs in fp16, bf16, fp8;
# 3. the profile of the compiled fp8 ViT-B body; 4. the paper's CERTIFY protocol timed in fp8;
# 5. ViT-L/16 throughput (fp16, fp8); 6. top-1 agreement (fp8 vs fp16, fused vs unfused fp8);
# 7. the demo certified in fp8. Results are packed after every step, so a step cut by the lease
# keeps what came before it. (As run on 2026-11-26 the throughput steps lacked --export-models,
# so they also exported engines, 500 MB that made every packing slow and the archive too large
# to bring back; the results were packed again without the engines.)
. "$(dirname "$0")/gpu_call_steps.sh"
certify_fp8() {
    "$PY" -m dmae_fast.cli.certify --data demo --max 100 --n0 100 --n 10000 --precision fp8 --quiet \
        --overwrite --out "$R/demo-fp8.tsv" && "$PY" -m dmae_fast.cli.certify analyze "$R/demo-fp8.tsv" > "$R/demo-fp8.md"
}
export -f certify_fp8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/gpu.txt" 2>&1
step install 60 "$PY" -m pip install --no-deps --no-build-isolation -e .
step fp8-test 70 "$PY" -m pytest -v -p no:cacheprovider -m gpu tests/test_fp8.py
THROUGHPUT=(--export-models --batches 1024 --main-batch 1024 --seconds 2)  # no engine export: 500 MB
step bench-vit-b 150 "$PY" -m dmae_fast.cli.bench throughput --models vit-b16 --variants fused+compiled+graphs \
    --precisions fp16 bf16 fp8 --budget 140 "${THROUGHPUT[@]}" --out "$R/bench-vit-b"
step profile-fp8 50 "$PY" bench/experiments/gpu_profile.py --model vit-b16 --batch 1024 --compile --precision fp8 \
    --out "$R/profile"
step certify-fp8 90 "$PY" -m dmae_fast.cli.bench certify --precisions fp8 --images 4 --reference-budget 4 \
    --budget 80 --out "$R/certify-fp8"
step bench-vit-l 120 "$PY" -m dmae_fast.cli.bench throughput --models vit-l16 --variants fused+compiled+graphs \
    --precisions fp16 fp8 --budget 110 "${THROUGHPUT[@]}" --out "$R/bench-vit-l"
step agreement 60 "$PY" bench/experiments/fp8_agreement.py --out "$R/agreement"
step demo-fp8 45 bash -c certify_fp8
