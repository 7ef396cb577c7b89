#!/usr/bin/env bash
# per tree: a pass's GPU time at ROWS (PROFILE=1: and the per-dispatch profile summed by op, shapes/), then bench rounds
# (ORDER of trees) at SESSIONS; VARIANT=--batch-variant as in every call here
# TREES: tree_NAME.tar.xz of the trees compared (async_runtime kernels resize examples); KIT: the export NAME.pte.xz and NAME.json
set -u
. results/h200/suite_on_both_backends/prelude.sh
M=llama3_2_1b_synthetic_4w_fp16_ctx2048
mkdir -p /tmp/m; [ -f /tmp/m/$M.pte ] || xz -T16 -dc $KIT/$M.pte.xz > /tmp/m/$M.pte
export PTE_WGPU_BACKEND=dawn
rm -rf /tmp/site/pte_wgpu
for f in $TREES/tree_*.tar.xz; do
  t=$(basename $f .tar.xz); t=${t#tree_}; d=/tmp/pt_$t
  [ -d $d ] || { mkdir -p $d && xz -dc $f | tar -x -C $d && mkdir -p $d/pte_wgpu && ln -sfn $d/kernels $d/pte_wgpu/kernels && ln -sfn $d/resize $d/pte_wgpu/resize; }
  [ -n "${ROWS:-}" ] && (cd $d && PYTHONPATH=$d:/tmp/site timeout 100 python3 examples/profile_ragged_decode.py /tmp/m/$M.pte $ROWS $VARIANT --whole-steps 2>&1 | grep "GPU time" | sed "s/^/$t /")
  [ "${PROFILE:-0}" = 1 ] && (cd $d && PYTHONPATH=$d:/tmp/site timeout 100 python3 examples/profile_ragged_decode.py /tmp/m/$M.pte $ROWS $VARIANT > $OUT/prof_$t.txt 2>&1)
done
n=0
for t in ${ORDER:-}; do
  n=$((n+1)); d=/tmp/pt_$t
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 150 python3 examples/bench_llm.py /tmp/m/$M.pte --params $OLDPWD/$KIT/$M.json --runs 1 \
    --sessions ${SESSIONS:-1,2,4,8,16} --batched-only --no-torch $VARIANT --json $OUT/${t}_$n.json > $OUT/${t}_$n.log 2>&1)
  python3 -c "
import json; r=json.load(open('$OUT/${t}_$n.json'))['wgpu']
print('$t $n', {k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill')) and isinstance(v, (int, float))})" 2>/dev/null || tail -5 $OUT/${t}_$n.log
done
(cd $OUT && tar -czf raw.tar.gz *.log && rm -f *.log)
