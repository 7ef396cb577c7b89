#!/usr/bin/env bash
# trees base (HEAD), live (dead result matrices skipped), new (live + halves two steps ahead)
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
mkdir -p /tmp/store3 /tmp/ao && tar -xJf .ab/store3.tar.xz -C /tmp/store3 && tar -xJf .ab/ao.tar.xz -C /tmp/ao
PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=/tmp/store3 PYTHONPATH=/tmp/site:$PWD:/tmp/ao timeout 150 \
  python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp16_linear.py -k "prompts_take_f16_matrices or batch_variant_products" > $OUT/tests_dawn.log 2>&1
echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests_dawn.log | tail -12
TREES="base live new base live new" ROWS=16,32,64 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]"
M=llama3_2_1b_synthetic_4w_fp16_ctx2048 TREES="base live new base live new" ROWS=16,32,64 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]" | sed 's/^/4w /'
echo "== all $(( $(date +%s) - t0 )) s"
