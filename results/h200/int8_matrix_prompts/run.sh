#!/usr/bin/env bash
# 8da4w prompts on int8 subgroup matrices: llama.cpp Q4_0 (llama-bench), ours on wgpu-native (the
# dequantizing GEMM), on Dawn without the matrices, on Dawn with them; llama.cpp again. Run from the
# checkout root with the device's setup done (README.txt); $MODELS holds the exports (.pte) and the
# GGUFs, $LLAMACPP the peer kit's unpacked binaries, $EXPORTS the tests' stored exports.
set -u
M_DIR=${MODELS:-/tmp/m}
HERE=results/h200/int8_matrix_prompts
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== tests on Dawn"
PTE_WGPU_BACKEND=dawn PTE_WGPU_EXPORT_DIR=$EXPORTS PTE_WGPU_REQUIRE_ADAPTER=1 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/test_int8_matrix.py tests/test_llama.py tests/test_batching.py -k "int8 or matrices or 8da4w" 2>&1 | tail -3
peer() { for G in $M_DIR/smollm2-q4_0.gguf $M_DIR/llama1b-q4_0.gguf; do
  timeout 120 $LLAMACPP/llama-bench -m $G -ngl 99 -fa 0,1 -p 512,2048 -n 0 -r 3 -o md 2>/dev/null | grep -E "pp"; done; }
echo "== llama.cpp round 1"; peer
for M in smollm2_synthetic_dq8a4w_ctx2048 llama3_2_1b_synthetic_dq8a4w_ctx2048; do
  for cfg in "wgpu-native" "dawn --no-matrices" "dawn"; do
    set -- $cfg
    echo "== ours $M $cfg"
    PTE_WGPU_BACKEND=$1 timeout 150 python3 $HERE/prefill.py $M_DIR/$M.pte ${2:-} --sizes 128,512,2047 --decode 32 2>&1 | tail -5
  done
  timeout 150 env PTE_WGPU_BACKEND=dawn python3 $HERE/same.py $M_DIR/$M.pte
done
echo "== llama.cpp round 2"; peer
echo "== the kernel alone"; PTE_WGPU_BACKEND=dawn timeout 100 python3 $HERE/mm_bench.py 2,2,2,2 2,2,1,2
