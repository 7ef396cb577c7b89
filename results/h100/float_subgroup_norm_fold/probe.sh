#!/usr/bin/env bash
# per tree of .ab/tree_*.tar.xz: a pass's GPU time at ROWS (--whole-steps), PROFILE=1 per-dispatch at PROF_ROWS; then bench ORDER rounds
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
M=${M:-llama3_2_1b_synthetic_4w_fp16_ctx2048}
mkdir -p /tmp/m; [ -f /tmp/m/$M.pte ] || xz -T16 -dc .bm/$M.pte.xz > /tmp/m/$M.pte
export PTE_WGPU_BACKEND=dawn
rm -rf /tmp/site/pte_wgpu
for f in .ab/tree_*.tar.xz; do
  t=$(basename $f .tar.xz); t=${t#tree_}; d=/tmp/pt_$t
  rm -rf $d; mkdir -p $d && xz -dc $f | tar -x -C $d && mkdir -p $d/pte_wgpu && ln -sfn $d/kernels $d/pte_wgpu/kernels && ln -sfn $d/resize $d/pte_wgpu/resize
done
for t in ${TREES:-base}; do d=/tmp/pt_$t
  [ -n "${ROWS:-}" ] && (cd $d && PYTHONPATH=$d:/tmp/site timeout 150 python3 examples/profile_ragged_decode.py /tmp/m/$M.pte $ROWS ${VARIANT---batch-variant} --whole-steps > $OUT/ws_$t.txt 2>&1; grep "GPU time" $OUT/ws_$t.txt | sed "s/^/$t /"; tail -2 $OUT/ws_$t.txt)
  [ "${PROFILE:-0}" = 1 ] && (cd $d && PYTHONPATH=$d:/tmp/site timeout 150 python3 examples/profile_ragged_decode.py /tmp/m/$M.pte ${PROF_ROWS:-16} ${VARIANT---batch-variant} > $OUT/prof_$t.txt 2>&1; head -30 $OUT/prof_$t.txt | sed "s/^/$t /")
  echo "== $t $(( $(date +%s) - t0 )) s"
done
n=0
for t in ${ORDER:-}; do
  n=$((n+1)); d=/tmp/pt_$t
  (cd $d && PYTHONPATH=$d:/tmp/site timeout 150 python3 examples/bench_llm.py /tmp/m/$M.pte --params $OLDPWD/.bm/$M.json --runs 1 \
    --sessions ${SESSIONS:-1,16} --batched-only --no-torch ${VARIANT---batch-variant} --json $OUT/${t}_$n.json > $OUT/${t}_$n.log 2>&1)
  python3 -c "
import json; r=json.load(open('$OUT/${t}_$n.json'))['wgpu']
print('$t $n', {k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill')) and isinstance(v, (int, float))})" 2>/dev/null || tail -5 $OUT/${t}_$n.log
done
ls $OUT/*.log >/dev/null 2>&1 && (cd $OUT && tar -czf raw.tar.gz *.log && rm -f *.log)
echo "== all $(( $(date +%s) - t0 )) s"
