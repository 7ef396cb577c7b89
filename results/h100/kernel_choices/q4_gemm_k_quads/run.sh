#!/usr/bin/env bash
# Prefill A/B of two wheels (.b8/v/old, .b8/v/new), two rounds, on the 1B 4w and SmolLM2 4w shapes.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) 2>&1 | tail -1
for v in old new; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m
for M in ${MODELS:-llama3_2_1b_synthetic_4w_ctx2048 smollm2_synthetic_4w_ctx2048}; do
  [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
  for round in 1 2; do for v in old new; do
    PYTHONPATH=/tmp/site_$v:/tmp/site timeout 120 python3 .ab1b/pf/prefill_ab.py /tmp/m/$M.pte "$M $v round $round" 2>&1 | grep -v Warn | tail -2
  done; done
done
[ -n "${PROFILE:-}" ] && PYTHONPATH=/tmp/site_new:/tmp/site timeout 120 python3 examples/profile_prefill.py /tmp/m/$PROFILE.pte 512 2>&1 | grep -v Warn | tail -16
