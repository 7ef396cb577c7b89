#!/usr/bin/env bash
# Prompts (and one stream) of the bench exports in .gk/ and .pk/ (*.pte.xz with their .json) before and after
# the GEMM's K steps of 8 in its 128 x 128 tile and its loads 4 of K at a time: .gk/before and .gk/after hold
# the two versions' wheels (or ${W}/before and ${W}/after); examples/bench_llm.py --sessions ${SESSIONS:-1}, each
# version twice, alternating.
source results/h200/ab_setup.sh ${W:-.gk}
mkdir -p /tmp/gk
for x in ${MODELS:-$(ls .gk/*.pte.xz .pk/*.pte.xz)}; do
  n=$(basename $x .pte.xz); p=/tmp/gk/$n.pte; [ -f $p ] || xz -T16 -dc $x > $p
  for round in 1 2; do
    for v in before after; do
      PYTHONPATH=/tmp/w_$v timeout 200 python3 examples/bench_llm.py $p --params $(dirname $x)/$n.json --runs 3 --sessions ${SESSIONS:-1} --batched-only --no-torch --json $OUT/${n}_${v}_$round.json > /tmp/gk/${v}.log 2>&1
      python3 -c "
import json; r=json.load(open('$OUT/${n}_${v}_$round.json'))['wgpu']
print('$n $v round $round', {k: round(v) for k, v in r.items() if k.startswith(('prefill', 'bursts'))})" 2>/dev/null || tail -5 /tmp/gk/${v}.log
    done
  done
done
