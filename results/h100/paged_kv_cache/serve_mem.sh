#!/usr/bin/env bash
# Time to first token with a cached system prompt, and conversations in a fixed KV memory (new wheel).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) .b8/v/new/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/m
for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do
  [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
  echo "== $M prefix"; timeout 150 python3 examples/bench_prefix_cache.py /tmp/m/$M.pte --system 1024 --user 32 --requests 6 2>&1 | grep -v Warn | tail -4
  for n in 56 64; do echo "== $M capacity $n"; timeout 150 python3 examples/bench_capacity.py /tmp/m/$M.pte --conversations $n 2>&1 | grep -v Warn | tail -2; done
done
