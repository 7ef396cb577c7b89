#!/usr/bin/env bash
# the fp16 linears' tests on Dawn (f16 matrices): test_fp16_linear -k TESTS (default: the fused ones) with exports
# from .ab/STORE.tar.xz (default store) and torchao from .ab/ao.tar.xz, into $OUT/tests_dawn.log, its summary printed
set -u
t0=$(date +%s)
store=${STORE:-store}
. results/h200/suite_on_both_backends/prelude.sh
mkdir -p /tmp/$store /tmp/ao && tar -xJf .ab/$store.tar.xz -C /tmp/$store && tar -xJf .ab/ao.tar.xz -C /tmp/ao
PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=/tmp/$store PYTHONPATH=/tmp/site:$PWD:/tmp/ao timeout 200 \
  python3 -m pytest -q -p no:cacheprovider -rfE tests/test_fp16_linear.py -k "${TESTS:-norm_fused}" > $OUT/tests_dawn.log 2>&1
echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests_dawn.log | tail -12
