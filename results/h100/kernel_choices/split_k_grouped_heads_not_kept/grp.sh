#!/usr/bin/env bash
# Grouped split-K (grp: the heads of one KV head in one workgroup) against one head a workgroup (b64).
set -u
VS="b64 grp" M=smollm2_synthetic_fp32_ctx2048 bash .ab1b/pf/blocks.sh 2>&1 | grep -v "^$\|WARN"
M=llama3_2_1b_synthetic_4w_ctx2048; [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
for round in 1 2; do for v in b64 grp; do
  export PYTHONPATH=/tmp/site_$v:/tmp/site VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
  a=$(timeout 100 python3 .ab1b/pf/bursts_probe.py /tmp/m/$M.pte 1 128 3 1000 2>&1 | grep median)
  b=$(timeout 100 python3 .ab1b/pf/bursts_probe.py /tmp/m/$M.pte 16 128 3 1000 2>&1 | grep median)
  echo "1B $v r$round | 1@1000: $a | 16@1000: $b"
done; done
