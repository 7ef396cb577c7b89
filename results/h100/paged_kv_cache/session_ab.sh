#!/usr/bin/env bash
# One call: time to first token with a cached system prompt (wheels mid: before the picking pass
# skipped its logits readback, new: after); decode A/B and first wave (old: whole-context slots, new: paged).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) 2>&1 | tail -1
for v in old mid new; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/m
for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048 ${EXTRA:-}; do [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte; done
if [ -z "${SKIP_TTFT:-}" ]; then
for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do for round in 1 2; do for v in mid new; do
  echo "== ttft $M $v round $round"
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 150 python3 examples/bench_prefix_cache.py /tmp/m/$M.pte --system 1024 --user 32 --requests 8 2>&1 | grep "time to first"
done; done; done
fi
bench() {  # model, sessions, mode, keys
  for round in 1 2; do for v in old new; do
    PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_llm.py /tmp/m/$1.pte --params .ab1b/models/$1.json --runs 2 \
      --sessions $2 $3 --no-torch --json /tmp/ab.json > /tmp/ab.log 2>&1
    python3 -c "
import json; r=json.load(open('/tmp/ab.json'))['wgpu']
print('$1 $v round $round', {k: round(v, 2) if 'over' in k else round(v) for k, v in r.items() if $4})" 2>/dev/null || tail -3 /tmp/ab.log
  done; done
}
for M in ${DECODE:-smollm2_synthetic_fp32_ctx2048}; do bench $M 32,64 --batched-only "k.startswith('bursts')"; done
[ -z "${SKIP_WAVE:-}" ] && bench smollm2_synthetic_4w_ctx2048 32 --generate-only "'first' in k or 'greedy_' in k and 'over' not in k"
