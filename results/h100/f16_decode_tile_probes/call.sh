#!/usr/bin/env bash
# (with the variants' trees in .ab/, README.txt; ws.sh runs ../float_subgroup_norm_fold/probe.sh per tree)
set -u
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
TREES="base pf2w s256 pf2s base pf2w s256 pf2s" ROWS=16,32,64 bash $(dirname $0)/ws.sh | grep -v "^== [0-9]"
echo "== fp16 $(( $(date +%s) - t0 )) s"
M=llama3_2_1b_synthetic_4w_fp16_ctx2048 TREES="base pf2w s256 pf2s base pf2w s256 pf2s" ROWS=16,32,64 bash $(dirname $0)/ws.sh | grep -v "^== [0-9]" | sed 's/^/4w /'
echo "== all $(( $(date +%s) - t0 )) s"
