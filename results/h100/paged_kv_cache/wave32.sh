#!/usr/bin/env bash
# First wave against steady at 32 sessions, SmolLM2 fp32, old and new wheels, two rounds (as session_ab.sh).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) 2>&1 | tail -1
for v in old new; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m; M=smollm2_synthetic_fp32_ctx2048
[ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
for round in 1 2; do for v in old new; do
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_llm.py /tmp/m/$M.pte --params .ab1b/models/$M.json --runs 2 \
    --sessions 32 --generate-only --no-torch --json /tmp/ab.json > /tmp/ab.log 2>&1
  python3 -c "
import json; r=json.load(open('/tmp/ab.json'))['wgpu']
print('$M $v round $round', {k: round(v, 2) if 'over' in k else round(v) for k, v in r.items() if 'first' in k or 'greedy_' in k and 'over' not in k})" 2>/dev/null || tail -3 /tmp/ab.log
done; done
