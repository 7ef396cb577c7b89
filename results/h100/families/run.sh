#!/usr/bin/env bash
# Real-shape exports of the other families (.fam/*.pte.xz with their .json): load, generate, check, bench.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
mkdir -p /tmp/fam
for x in .fam/*.pte.xz; do
  n=$(basename $x .pte.xz); p=/tmp/fam/$n.pte
  [ -f $p ] || xz -T16 -dc $x > $p
  timeout 150 python3 .fam/check.py $p 2>&1 | grep -v Warn | tail -3
  timeout 200 python3 examples/bench_llm.py $p --params .fam/$n.json --runs 2 --sessions 1,16,64 --batched-only --no-torch --json $OUT/ours_$n.json > /tmp/fam/$n.log 2>&1
  python3 -c "
import json; r=json.load(open('$OUT/ours_$n.json'))['wgpu']
print('$n', {k: (round(v, 2) if isinstance(v, float) and v < 10 else round(v)) if isinstance(v, (int, float)) else v for k, v in r.items() if k.startswith(('load_s', 'bursts', 'prefill_512', 'prefill_2047', 'batching', 'model_memory'))})" 2>/dev/null || tail -5 /tmp/fam/$n.log
done
p=$(ls /tmp/fam/*.pte | head -1)
timeout 120 python3 .fam/oom.py $p 2>&1 | grep -v Warn | tail -5
