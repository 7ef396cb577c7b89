#!/usr/bin/env bash
# the standalone f16 subgroup-matrix GEMM (robustness off, as the runtime runs Dawn) in tiles of other shapes and K steps
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
NOROBUST=1 REPS_MNK=4e11 SHAPES="4096,4096,4096 512,3072,2048 2048,16384,2048 512,2048,8192" timeout ${GT:-200} \
  python3 results/h200/f16_subgroup_matrix_gemm/f16gemm.py \
  2,2,4,4,32 2,4,4,4,16 4,4,4,4,16 2,4,4,4,32,0 4,2,4,4,16 2,2,4,4,16 2,2,4,4,32,0 2>&1 | grep -E "^cfg|rror" | tee $OUT/gemm_tiles.txt
echo "== gemm $(( $(date +%s) - t0 )) s"
