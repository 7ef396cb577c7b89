#!/usr/bin/env bash
# trees base (HEAD), live (dead result matrices skipped), new (live + halves two steps ahead)
set -u
t0=$(date +%s)
STORE=store3 TESTS="prompts_take_f16_matrices or batch_variant_products" bash results/h100/float_subgroup_norm_fold/gputests.sh
TREES="base live new base live new" ROWS=16,32,64 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]"
M=llama3_2_1b_synthetic_4w_fp16_ctx2048 TREES="base live new base live new" ROWS=16,32,64 bash results/h100/f16_decode_tile_probes/ws.sh | grep -v "^== [0-9]" | sed 's/^/4w /'
echo "== all $(( $(date +%s) - t0 )) s"
