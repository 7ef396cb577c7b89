#!/usr/bin/env bash
# Dawn with and without its robustness checks beside wgpu-native (SmolLM2 fp32 bursts), and more int8 GEMM tiles.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) .b8/v/new/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
echo "== i8 gemm, robustness off"; NOROBUST=1 timeout 150 python3 results/h100/int8_subgroup_matrix_gemm/i8gemm.py $CFGS 2>&1 | grep "^cfg"
mkdir -p /tmp/m; M=smollm2_synthetic_fp32_ctx2048
[ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/m2/$M.pte.xz > /tmp/m/$M.pte
cat > /tmp/norobust.py <<'PY'
import sys, runpy, wgpudawn
from wgpudawn.backends.dawn import extras
extras.set_instance_extras(backends=["Vulkan"], enable_toggles=sys.argv[1].split(","))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
PY
for round in 1 2; do
for b in native robust norobust; do
  if [ $b = native ]; then run="python3 results/h100/paged_kv_cache/bursts_probe.py"; export PTE_WGPU_BACKEND=wgpu-native
  elif [ $b = robust ]; then run="python3 results/h100/paged_kv_cache/bursts_probe.py"; export PTE_WGPU_BACKEND=dawn
  else run="python3 /tmp/norobust.py disable_robustness results/h100/paged_kv_cache/bursts_probe.py"; export PTE_WGPU_BACKEND=dawn; fi
  a=$(timeout 100 $run /tmp/m/$M.pte 1 128 3 8 2>&1 | grep -E "median|Error" | tail -1)
  c=$(timeout 100 $run /tmp/m/$M.pte 16 128 3 8 2>&1 | grep -E "median|Error" | tail -1)
  echo "round $round $b | 1: $a | 16: $c"
done; done
