#!/usr/bin/env bash
# ViT-B/16 at batch 1 and 8 ($1/vit.tar.xz: examples/bench_vision.py export --models vit_b16, tiled weights)
# before and after a change ($1/before, $1/after: the two versions' wheels), torch eager CUDA in each run
# (examples/bench_vision.py run), twice, alternating; with PROFILE=1 then one profiled run of each.
source results/h200/ab_setup.sh $1
mkdir -p /tmp/vit; [ -f /tmp/vit/manifest.json ] || xz -T16 -dc $1/vit.tar.xz | tar -x -C /tmp/vit
for round in 1 2; do
  for v in before after; do
    PYTHONPATH=/tmp/w_$v timeout 200 python3 examples/bench_vision.py run /tmp/vit --models vit_b16 --runs 30 --json $OUT/vit_${v}_$round.json > /tmp/vit/$v.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/vit_${v}_$round.json'))
print('$v round $round', [(x['batch'], round(x['wgpu_ms'], 2), round(x['torch_ms'], 2), x['matches']) for x in r['rows']])" || tail -5 /tmp/vit/$v.log
  done
done
for v in ${PROFILE:+before after}; do
  echo "== $v profile"
  PYTHONPATH=/tmp/w_$v timeout 200 python3 examples/bench_vision.py run /tmp/vit --models vit_b16 --runs 5 --profile 2>&1 | grep -E "dispatches|vit_b16 \|" | head -30
done
