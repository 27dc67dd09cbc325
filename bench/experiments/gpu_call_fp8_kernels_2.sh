#!/usr/bin/env bash
# The second device call of 2026-11-27 (issue 38): after call 1 (gpu_call_fp8_kernels.sh) the new fp8
# kernels failed their GPU tests (LayerNorm kernel: an alias torch.compile could not see; byte-agreement
# bounds set without a GPU), so call 1 timed the last commit's fp8 body. This call: the fixed GPU tests,
# then ViT-B/16 fp8 throughput with the new kernels (fp16 in the same run as the baseline) and the profile.
#   OUT=<folder> bash bench/experiments/gpu_call_fp8_kernels_2.sh    -> OUT/gpu-call.tar.gz
# (As run: tests/test_layernorm_quantize.py existed then; the kernel it tests was removed afterwards.)
. "$(dirname "$0")/gpu_call_steps.sh"
step install 60 "$PY" -m pip install --no-deps --no-build-isolation -e .
step gpu-tests 90 "$PY" -m pytest -v -s -p no:cacheprovider -m gpu tests/test_gelu_quantize.py \
    tests/test_layernorm_quantize.py tests/test_fp8.py \
    "tests/test_fast_body.py::test_a_run_with_the_previous_runs_layout_replays_its_captured_graph"
step bench-vit-b 100 "$PY" -m dmae_fast.cli.bench throughput --models vit-b16 --variants fused+compiled+graphs \
    --precisions fp16 fp8 --budget 90 --export-models --batches 1024 --main-batch 1024 --seconds 2 --out "$R/bench-vit-b"
step profile-fp8 40 "$PY" bench/experiments/gpu_profile.py --model vit-b16 --batch 1024 --compile --precision fp8 \
    --out "$R/profile"
