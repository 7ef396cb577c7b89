#!/usr/bin/env bash
# Qwen3.5-0.8B's widths with 4 of its layers, 4w (.hyb/*.pte.xz with its .json), before and after its
# convolution and delta-rule states joined the ragged pass: .hyb/before and .hyb/after hold the two
# versions' wheels. The check (../families/hybrid_check.py) on the newer one, then greedy bursts of
# 1 / 16 / 64 streams and prompts: the older version once, the newer twice, around it.
source results/h200/ab_setup.sh .hyb
mkdir -p /tmp/hyb
x=$(ls .hyb/*.pte.xz | head -1); n=$(basename $x .pte.xz); p=/tmp/hyb/$n.pte
[ -f $p ] || xz -T16 -dc $x > $p
PYTHONPATH=/tmp/w_after timeout 200 python3 results/h200/families/hybrid_check.py $p /tmp/hyb/$n.ref.npz --save 2>&1 | grep -v Warn | tail -3
for run in after_1 before_1 after_2; do
  v=${run%_*}
  PYTHONPATH=/tmp/w_$v timeout 150 python3 examples/bench_llm.py $p --params .hyb/$n.json --runs 2 --sessions 1,16,64 --batched-only --no-torch --json $OUT/$run.json > /tmp/hyb/$run.log 2>&1
  python3 -c "
import json; r=json.load(open('$OUT/$run.json'))['wgpu']
print('$run', {k: (round(v, 2) if isinstance(v, float) and v < 10 else round(v)) if isinstance(v, (int, float)) else v for k, v in r.items() if k.startswith(('load_s', 'bursts', 'sessions_', 'prefill_512', 'prefill_2047', 'batching'))})" 2>/dev/null || tail -5 /tmp/hyb/$run.log
done
