#!/usr/bin/env bash
# the 4-bit GPU tests on Dawn, then the 1B decode A/B with llama.cpp
# STORE_TAR: a tar.xz of the tests' exports (f16_q4_*, q4_fused_*, llama_4w_wide); AO: torchao's .py files; the rest as against_llamacpp.sh
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
mkdir -p .st /tmp/ao && tar -xJf $STORE_TAR -C .st && tar -xJf $AO -C /tmp/ao
PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=$PWD/.st PYTHONPATH=$PYTHONPATH:/tmp/ao timeout 300 \
  python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp16_linear.py tests/test_q4_fusion.py -k "asyncio and not cpu and (q4 or wide) and not 4w_llama_fuses" > $OUT/tests.log 2>&1
echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests.log | tail -12
rm -rf /tmp/site/pte_wgpu
MODELS=llama3_2_1b_synthetic_4w_fp16_ctx2048:llama1b-q4_0 SESSIONS=${SESSIONS:-1,2,16,32,64} bash results/h100/split_k_two_weight_rows/against_llamacpp.sh
