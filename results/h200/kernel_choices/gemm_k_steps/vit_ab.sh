#!/usr/bin/env bash
# ViT-B/16 at batch 1 and 8 (.gk/vit.tar.xz: examples/bench_vision.py export --models vit_b16, tiled weights)
# before and after the GEMM's K steps of 8 and loads 4 of K at a time (.gk/before, .gk/after: the two versions'
# wheels), with torch eager CUDA in each run (examples/bench_vision.py run), twice, alternating.
source results/h200/ab_setup.sh .gk
mkdir -p /tmp/vit; [ -f /tmp/vit/manifest.json ] || xz -T16 -dc .gk/vit.tar.xz | tar -x -C /tmp/vit
for round in 1 2; do
  for v in before after; do
    PYTHONPATH=/tmp/w_$v timeout 200 python3 examples/bench_vision.py run /tmp/vit --models vit_b16 --runs 30 --json $OUT/vit_${v}_$round.json > /tmp/vit/$v.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/vit_${v}_$round.json'))
print('$v round $round', [(x['batch'], round(x['wgpu_ms'], 2), round(x['torch_ms'], 2), x['matches']) for x in r['rows']])" || tail -5 /tmp/vit/$v.log
  done
done
