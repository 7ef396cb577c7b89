#!/usr/bin/env bash
# Block sizes: decode bursts (1 and 16 streams after 1,000-token prompts, 64 after 8) and time to first token with a cached system prompt, per wheel.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) 2>&1 | tail -1
VS="${VS:-new b64 b32 b16}"
for v in $VS; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m; M=${M:-smollm2_synthetic_fp32_ctx2048}
[ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
for round in 1 2; do for v in $VS; do
  export PYTHONPATH=/tmp/site_$v:/tmp/site
  a=$(timeout 100 python3 .ab1b/pf/bursts_probe.py /tmp/m/$M.pte 1 128 3 1000 2>&1 | grep median)
  b=$(timeout 100 python3 .ab1b/pf/bursts_probe.py /tmp/m/$M.pte 16 128 3 1000 2>&1 | grep median)
  c=$(timeout 100 python3 .ab1b/pf/bursts_probe.py /tmp/m/$M.pte 64 128 3 8 2>&1 | grep median)
  d=$(timeout 100 python3 examples/bench_prefix_cache.py /tmp/m/$M.pte --system 1024 --user 32 --requests 8 2>&1 | grep "time to first" | sed 's/time to first token: //')
  echo "$v r$round | 1@1000: $a | 16@1000: $b | 64@8: $c | ttft $d"
done; done
