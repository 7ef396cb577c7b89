#!/usr/bin/env bash
# Qwen3.5-0.8B's widths with 4 of its layers, 4w (.hyb/*.pte.xz with its .json), the newer code (.hyb/after) alone:
# the per-op profile of a prompt of 512 (examples/profile_prefill.py), then the bench twice.
source results/h200/ab_setup.sh .hyb
mkdir -p /tmp/hyb
x=$(ls .hyb/*.pte.xz | head -1); n=$(basename $x .pte.xz); p=/tmp/hyb/$n.pte
[ -f $p ] || xz -T16 -dc $x > $p
PYTHONPATH=/tmp/w_after timeout 200 python3 examples/profile_prefill.py $p 512 2>&1 | grep -v Warn | head -8
for run in after_3 after_4; do
  PYTHONPATH=/tmp/w_after timeout 150 python3 examples/bench_llm.py $p --params .hyb/$n.json --runs 2 --sessions 1,16,64 --batched-only --no-torch --json $OUT/$run.json > /tmp/hyb/$run.log 2>&1
  python3 -c "
import json; r=json.load(open('$OUT/$run.json'))['wgpu']
print('$run', {k: (round(v, 2) if isinstance(v, float) and v < 10 else round(v)) if isinstance(v, (int, float)) else v for k, v in r.items() if k.startswith(('load_s', 'bursts', 'prefill_512', 'prefill_2047', 'batching'))})" 2>/dev/null || tail -5 /tmp/hyb/$run.log
done
