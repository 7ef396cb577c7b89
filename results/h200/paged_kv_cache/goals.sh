#!/usr/bin/env bash
# The paged KV cache in one call: first wave against steady, a cached system prompt, conversations in a fixed memory (.b8/v/new).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) .b8/v/new/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/m
for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do
  [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
  for round in 1 2; do
    timeout 200 python3 examples/bench_llm.py /tmp/m/$M.pte --params .ab1b/models/$M.json --runs 2 \
      --sessions 16,32,64 --generate-only --no-torch --json $OUT/wave_${M}_$round.json > /tmp/ab.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/wave_${M}_$round.json'))['wgpu']
print('$M wave round $round', {k: round(v, 2) if 'over' in k else round(v) for k, v in r.items() if 'first' in k or 'greedy_' in k and 'over' not in k})" 2>/dev/null || tail -3 /tmp/ab.log
  done
  echo "== $M prefix"; timeout 150 python3 examples/bench_prefix_cache.py /tmp/m/$M.pte --system 1024 --user 32 --requests 8 2>&1 | grep -v Warn | tail -4
  for n in 56 64; do echo "== $M capacity $n"; timeout 150 python3 examples/bench_capacity.py /tmp/m/$M.pte --conversations $n 2>&1 | grep -v Warn | tail -2; done
done
