#!/usr/bin/env bash
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) 2>&1 | tail -1
for v in ${VS:-old new}; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m; M=${M:-smollm2_synthetic_fp32_ctx2048}
[ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
for round in 1 2; do for v in ${VS:-old new}; do for st in ${STEPS:-64 256}; do echo "== $v round $round steps $st"
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 120 python3 .ab1b/pf/bursts_probe.py /tmp/m/$M.pte ${N:-64} $st ${RUNS:-5} 2>&1 | grep -v Warn | tail -${TAIL:-6}
done; done; done
