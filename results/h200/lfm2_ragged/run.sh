#!/usr/bin/env bash
# LFM2-350M 4w (.hyb/*.pte.xz with its .json and the lavapipe run's logits, *.ref.npz) before and after
# its short-convolution states joined the ragged pass: .hyb/before and .hyb/after hold the two versions'
# wheels. The check (hybrid_check.py) on the newer one, then greedy bursts of 1 / 16 / 64 streams and
# prompts, each version twice, alternating.
source results/h200/ab_setup.sh .hyb
mkdir -p /tmp/hyb
x=$(ls .hyb/*.pte.xz | head -1); n=$(basename $x .pte.xz); p=/tmp/hyb/$n.pte
[ -f $p ] || xz -T16 -dc $x > $p
PYTHONPATH=/tmp/w_after timeout 240 python3 results/h200/families/hybrid_check.py $p .hyb/$n.ref.npz 2>&1 | grep -v Warn | tail -3
for round in 1 2; do
  for v in before after; do
    PYTHONPATH=/tmp/w_$v timeout 150 python3 examples/bench_llm.py $p --params .hyb/$n.json --runs 2 --sessions 1,16,64 --batched-only --no-torch --json $OUT/${v}_$round.json > /tmp/hyb/${v}_$round.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/${v}_$round.json'))['wgpu']
print('$v round $round', {k: (round(v, 2) if isinstance(v, float) and v < 10 else round(v)) if isinstance(v, (int, float)) else v for k, v in r.items() if k.startswith(('load_s', 'bursts', 'sessions_', 'prefill_512', 'prefill_2047', 'batching'))})" 2>/dev/null || tail -5 /tmp/hyb/${v}_$round.log
  done
done
