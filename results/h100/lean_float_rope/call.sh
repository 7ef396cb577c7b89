#!/usr/bin/env bash
# one call: the RoPE fusion tests on Dawn (store of llama_fp32 exports in .ab/store2.tar.xz), then the 1B fp16's
# one-row pass GPU time per tree (base, new, base, new) and one-stream bench rounds (new, base, new, base)
set -u
. results/h200/suite_on_both_backends/prelude.sh
probe=results/h100/float_subgroup_norm_fold/probe.sh
mkdir -p /tmp/store2 /tmp/ao && tar -xJf .ab/store2.tar.xz -C /tmp/store2 && tar -xJf .ab/ao.tar.xz -C /tmp/ao
PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=/tmp/store2 PYTHONPATH=/tmp/site:$PWD:/tmp/ao timeout 150 \
  python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_batching.py -k "rope or graphs" > $OUT/tests_lean.log 2>&1
echo "== tests rc=$?"; grep -E "passed|failed|FAILED|Error|SKIP" $OUT/tests_lean.log | tail -8
export M=llama3_2_1b_synthetic_fp16_ctx2048
TREES="base new base new" ROWS=1 bash $probe 2>&1 | grep -v WARN | grep -E "GPU time|rror" | grep -v "^=="
TREES= ORDER="new base new base" SESSIONS=1 bash $probe 2>&1 | grep -v WARN | grep -E "^(base|new) |rror"
