#!/usr/bin/env bash
# Llama-3.2-1B shape 4w (.pf/llama1b_4w.pte.xz, examples/export_bench_model.py --shape llama3_2_1b --qmode 4w)
# before and after one-row 4-bit kernels of K >= 8,192 loading 4 steps ahead (.pf/before, .pf/after: the two
# versions' wheels): examples/bench_llm.py greedy bursts at ${SESSIONS:-1,4,16}, each version twice, alternating.
source results/h200/ab_setup.sh .pf
mkdir -p /tmp/m; [ -f /tmp/m/m1b.pte ] || xz -T16 -dc .pf/llama1b_4w.pte.xz > /tmp/m/m1b.pte
for round in 1 2; do
  for v in before after; do
    PYTHONPATH=/tmp/w_$v timeout 200 python3 examples/bench_llm.py /tmp/m/m1b.pte --params .pf/llama1b_4w.json --runs ${RUNS:-5} \
      --sessions ${SESSIONS:-1,4,16} --batched-only --no-torch --json $OUT/${v}_$round.json > /tmp/m/$v.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/${v}_$round.json'))['wgpu']
print('$v round $round', {k: round(v) for k, v in r.items() if k.startswith('bursts')})" 2>/dev/null || tail -5 /tmp/m/$v.log
  done
done
