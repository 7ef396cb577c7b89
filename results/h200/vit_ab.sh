#!/usr/bin/env bash
# ViT-B/16 at batch 1 and 8 ($1/vit.tar.xz: examples/bench_vision.py export --models vit_b16, tiled weights)
# before and after a change ($1/before, $1/after: the two versions' wheels), torch eager CUDA in each run
# (examples/bench_vision.py run), twice, alternating; with PROFILE=1 then one profiled run of each.
# Other vision exports: ARCHIVE (in $1), MODELS (bench_vision.py's names, comma-separated), PROFILED (those profiled).
source results/h200/ab_setup.sh $1
ARCHIVE=${ARCHIVE:-vit.tar.xz} MODELS=${MODELS:-vit_b16}
dir=/tmp/$(basename $ARCHIVE .tar.xz)
mkdir -p $dir; [ -f $dir/manifest.json ] || xz -T16 -dc $1/$ARCHIVE | tar -x -C $dir
for round in 1 2; do
  for v in before after; do
    PYTHONPATH=/tmp/w_$v timeout 200 python3 examples/bench_vision.py run $dir --models $MODELS --runs 30 --json $OUT/$(basename $dir)_${v}_$round.json > $dir/$v.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/$(basename $dir)_${v}_$round.json'))
print('$v round $round', [(x['model'], x['batch'], round(x['wgpu_ms'], 2), round(x['torch_ms'], 2), x['matches']) for x in r['rows']])" || tail -5 $dir/$v.log
  done
done
for v in ${PROFILE:+before after}; do
  echo "== $v profile"
  PYTHONPATH=/tmp/w_$v timeout 200 python3 examples/bench_vision.py run $dir --models ${PROFILED:-$MODELS} --runs 5 --profile 2>&1 | grep -E "dispatches| \| " | head -30
done
