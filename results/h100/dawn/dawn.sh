#!/usr/bin/env bash
# The int8 GEMM (robustness on and off), SmolLM2 on Dawn, then a part of the test suite on Dawn with carried exports.
# Folders it reads: .whl1b (wgpu, wgpudawn and their needs as wheels), .b8/v/new (this checkout as a wheel), .whlt (pytest),
# .ab1b/m2 (the SmolLM2-shaped exports, .pte.xz), .ab1b/exp (the tests' exports, made where ExecuTorch runs).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) .b8/v/new/*.whl .whlt/pytest*.whl .whlt/pluggy*.whl .whlt/iniconfig*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
if [ -n "${CFGS:-}" ]; then
echo "== i8 gemm"; timeout 120 python3 results/h100/int8_subgroup_matrix_gemm/i8gemm.py $CFGS 2>&1 | grep "^cfg"
echo "== i8 gemm, robustness off"; NOROBUST=1 timeout 120 python3 results/h100/int8_subgroup_matrix_gemm/i8gemm.py $CFGS 2>&1 | grep "^cfg"
fi
mkdir -p /tmp/m; for M in ${MODEL:-}; do
[ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/m2/$M.pte.xz > /tmp/m/$M.pte
echo "== $M native"; DAWN=0 timeout 100 python3 results/h100/dawn/dawn_probe.py /tmp/m/$M.pte 2>&1 | grep -E "^(logits|generate|[A-Za-z]+Error)" | tail -6
echo "== $M dawn"; DAWN=1 timeout 150 python3 results/h100/dawn/dawn_probe.py /tmp/m/$M.pte 2>&1 | grep -E "^(DeviceInfo|logits|generate|[A-Za-z]+Error|.*rror:| - While)" | cut -c1-400 | tail -14
[ -f /tmp/logits_dawn.npy ] && python3 -c "
import numpy as np, os; a=np.load('/tmp/logits_native.npy'); b=np.load('/tmp/logits_dawn.npy'); os.remove('/tmp/logits_dawn.npy'); print('max |dawn - native|', np.abs(a-b).max(), 'of', np.abs(a).max())"
for b in wgpu-native dawn; do
  a=$(PTE_WGPU_BACKEND=$b timeout 100 python3 results/h100/paged_kv_cache/bursts_probe.py /tmp/m/$M.pte 1 128 3 8 2>&1 | grep -E "median|Error" | tail -1)
  c=$(PTE_WGPU_BACKEND=$b timeout 100 python3 results/h100/paged_kv_cache/bursts_probe.py /tmp/m/$M.pte 16 128 3 8 2>&1 | grep -E "median|Error" | tail -1)
  echo "$b bursts | 1: $a | 16: $c"
done
done
if [ -n "${TESTS:-}" ]; then
  echo "== tests on ${TEST_BACKEND:-dawn}"
  PTE_WGPU_BACKEND=${TEST_BACKEND:-dawn} PTE_WGPU_EXPORT_DIR=$PWD/.ab1b/exp PTE_WGPU_REQUIRE_ADAPTER=1 timeout ${TEST_T:-240} python3 -m pytest -q -p no:cacheprovider -rf $TESTS 2>&1 | tee $OUT/tests.log | grep -E "passed|failed|^FAILED|^ERROR" | cut -c1-300 | tail -40
fi
