#!/usr/bin/env bash
# one call (trees .ab/tree_{base,direct,w16,pahead}.tar.xz): the working tree's Dawn tests (split-K's whole result
# matrices straight into the scratch), a pass's GPU time base / direct (4w 16 and 32 rows, fp16 16), the 1B fp16's
# prompts on trees base / w16 / pahead, then the standalone GEMM's tiles with the time left
set -u
t0=$(date +%s)
STORE=store3 TESTS="prompts_take_f16_matrices or batch_variant_products" bash results/h100/float_subgroup_norm_fold/gputests.sh
M=llama3_2_1b_synthetic_4w_fp16_ctx2048 TREES="base direct" ROWS=16,32 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]" | sed 's/^/4w /'
echo "== ws4w $(( $(date +%s) - t0 )) s"
TREES="base direct" ROWS=16 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]"
echo "== ws16 $(( $(date +%s) - t0 )) s"
[ $(( $(date +%s) - t0 )) -lt 260 ] && M=llama3_2_1b_synthetic_fp16_ctx2048 TREES= ORDER="base w16 pahead" SESSIONS=1 \
  bash results/h100/float_subgroup_norm_fold/probe.sh 2>&1 | grep -v WARN | grep -E "^(base|pahead|w16) |rror"
echo "== prompts $(( $(date +%s) - t0 )) s"
left=$(( 430 - ($(date +%s) - t0) )); [ $left -gt 40 ] && GT=$left bash results/h100/f16_prompt_tile_probes/gemm_tiles.sh
echo "== all $(( $(date +%s) - t0 )) s"
