#!/usr/bin/env bash
# Greedy bursts of the Llama-3.2-1B shape 4w (.pk/*.pte.xz and its .json) at stream counts between powers
# of two: ragged passes padded to powers of two (.pad/before, cbd67e4) against four steps a power of
# two (.pad/after), each twice, alternating (examples/bench_llm.py).
source results/h200/ab_setup.sh .pad
p=/tmp/1b.pte
[ -f $p ] || xz -T16 -dc .pk/*.pte.xz > $p
for round in 1 2; do
  for v in before after; do
    PYTHONPATH=/tmp/w_$v timeout 140 python3 examples/bench_llm.py $p --params .pk/llama3_2_1b_synthetic_4w_ctx2048.json --runs 2 --sessions 20,24,40,48,64 --batched-only --no-torch --json $OUT/${v}_$round.json > /tmp/${v}_$round.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/${v}_$round.json'))['wgpu']
print('$v round $round', {k: round(v) for k, v in r.items() if k.startswith('bursts')})" 2>/dev/null || tail -5 /tmp/${v}_$round.log
  done
done
