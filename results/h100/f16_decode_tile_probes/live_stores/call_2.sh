#!/usr/bin/env bash
# trees base / ahead (two steps ahead only) / stores (ahead + dead stores skipped) / new (ahead + dead products and stores skipped), fp16 then 4w
set -u
t0=$(date +%s)
TREES="base ahead stores new base ahead stores new" ROWS=16,32,64 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]"
M=llama3_2_1b_synthetic_4w_fp16_ctx2048 TREES="base stores new base stores new" ROWS=16,32,64 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]" | sed 's/^/4w /'
M=llama3_2_1b_synthetic_fp16_ctx2048 TREES="base new" PROFILE=1 PROF_ROWS=16 bash results/h100/float_subgroup_norm_fold/probe.sh 2>&1 | grep -v WARN | grep -E "^(base|new) " | head -70
echo "== all $(( $(date +%s) - t0 )) s"
