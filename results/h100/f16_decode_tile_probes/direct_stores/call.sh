#!/usr/bin/env bash
# one call (trees .ab/tree_{base,direct,w16,pahead}.tar.xz): the working tree's Dawn tests (split-K's whole result
# matrices straight into the scratch), a pass's GPU time base / direct (4w 16 and 32 rows, fp16 16), the 1B fp16's
# prompts on trees base / w16 / pahead, then the standalone GEMM's tiles with the time left
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
mkdir -p /tmp/store3 /tmp/ao && tar -xJf .ab/store3.tar.xz -C /tmp/store3 && tar -xJf .ab/ao.tar.xz -C /tmp/ao
PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=/tmp/store3 PYTHONPATH=/tmp/site:$PWD:/tmp/ao timeout 150 \
  python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp16_linear.py -k "prompts_take_f16_matrices or batch_variant_products" > $OUT/tests_dawn.log 2>&1
echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests_dawn.log | tail -12
M=llama3_2_1b_synthetic_4w_fp16_ctx2048 TREES="base direct" ROWS=16,32 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]" | sed 's/^/4w /'
echo "== ws4w $(( $(date +%s) - t0 )) s"
TREES="base direct" ROWS=16 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]"
echo "== ws16 $(( $(date +%s) - t0 )) s"
[ $(( $(date +%s) - t0 )) -lt 260 ] && M=llama3_2_1b_synthetic_fp16_ctx2048 TREES= ORDER="base w16 pahead" SESSIONS=1 \
  bash results/h100/float_subgroup_norm_fold/probe.sh 2>&1 | grep -v WARN | grep -E "^(base|pahead|w16) |rror"
echo "== prompts $(( $(date +%s) - t0 )) s"
left=$(( 430 - ($(date +%s) - t0) )); [ $left -gt 40 ] && GT=$left bash results/h100/f16_prompt_tile_probes/gemm_tiles.sh
echo "== all $(( $(date +%s) - t0 )) s"
