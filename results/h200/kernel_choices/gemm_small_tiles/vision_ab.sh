#!/usr/bin/env bash
# ViT-B/16, ResNet-50 and MobileNet V2 at batch 1 and 8 (.gk/vit.tar.xz, .gk/cnn.tar.xz: examples/bench_vision.py
# export, tiled weights) before and after products of too few tiles to split K took the 32 x 64 tile on GPUs
# (.gk/before, .gk/after: the two versions' wheels), torch eager CUDA in each run, twice, alternating.
source results/h200/ab_setup.sh .gk
for set in ${SETS:-vit cnn}; do
  mkdir -p /tmp/$set; [ -f /tmp/$set/manifest.json ] || xz -T16 -dc .gk/$set.tar.xz | tar -x -C /tmp/$set
done
for round in 1 2; do
  for v in before after; do
    for set in ${SETS:-vit cnn}; do
      PYTHONPATH=/tmp/w_$v timeout 250 python3 examples/bench_vision.py run /tmp/$set --runs 30 --json $OUT/${set}_${v}_$round.json > /tmp/$set/$v.log 2>&1
      python3 -c "
import json; r=json.load(open('$OUT/${set}_${v}_$round.json'))
print('$v round $round', [(x['model'], x['batch'], round(x['wgpu_ms'], 2), round(x['torch_ms'], 2), x['matches']) for x in r['rows']])" || tail -5 /tmp/$set/$v.log
    done
  done
done
