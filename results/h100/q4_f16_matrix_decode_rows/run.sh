#!/usr/bin/env bash
# On the GPU machine, from the checkout root: the tests of the f16 matrices on Dawn, llama.cpp's batched decode,
# then ours (examples/bench_llm.py) under each tree of ORDER (TREE@BACKEND: "new" is this checkout, "old" the
# tree in OLD_TREE, any other NAME the tree in $TREES_DIR/tree_NAME.tar.xz), llama.cpp again.
# WHEELS: wgpu-py's wheels with wgpudawn's; KIT: the export NAME.pte.xz with its NAME.json (M), the GGUF
# llama1b-q4_0.gguf.xz (G) and llamacpp-bin.tar.xz; STORE: an export store of tests/test_fp16_linear.py's
# cases; AO: a tar.xz of torchao's Python files (the machine has none: the quantized cases' eager modules).
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
M=${M:-llama3_2_1b_synthetic_4w_fp16_ctx2048} G=${G:-llama1b-q4_0}
mkdir -p /tmp/ao && tar -xJf $AO -C /tmp/ao
if [ "${TESTS:-1}" = 1 ]; then
  PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=$PWD/$STORE PYTHONPATH=/tmp/site:$PWD:/tmp/ao timeout 240 \
    python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_fp16_linear.py -k "asyncio and (matrices or match_eager)" > $OUT/tests_dawn.log 2>&1
  echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED" $OUT/tests_dawn.log | tail -25
fi
mkdir -p /tmp/m /tmp/lc
[ -f /tmp/m/$M.pte ] || xz -T16 -dc $KIT/$M.pte.xz > /tmp/m/$M.pte
[ -f /tmp/m/$G.gguf ] || xz -dc $KIT/$G.gguf.xz > /tmp/m/$G.gguf
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc $KIT/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
peer() {  # llama-batched-bench's S_TG, flash attention on and off, the better per row
  for fa in on off; do
    timeout 120 /tmp/lc/llamacpp-bin/llama-batched-bench -m /tmp/m/$G.gguf -ngl 99 -fa $fa -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 \
      -npl 1,16,32,64 --output-format jsonl 2>/dev/null | grep '^{' > $OUT/lc_batched_${fa}_$1.jsonl
  done
  python3 -c "
import json
rows = {}
for fa in ('on', 'off'):
    for line in open('$OUT/lc_batched_' + fa + '_$1.jsonl'):
        r = json.loads(line); rows[r['pl']] = max(rows.get(r['pl'], 0), r['speed_tg'])
print('llama.cpp $1', {k: round(v) for k, v in sorted(rows.items())})"
}
[ "${PEER:-1}" = 1 ] && peer 1
rm -rf /tmp/site/pte_wgpu /tmp/t_old /tmp/t_new; mkdir -p /tmp/t_old /tmp/t_new
cp -r async_runtime kernels resize examples /tmp/t_new/
xz -dc $OLD_TREE | tar -x -C /tmp/t_old
TREES="old new"
for f in ${TREES_DIR:-/nonexistent}/tree_*.tar.xz; do [ -f "$f" ] || continue; t=$(basename $f .tar.xz); t=${t#tree_}; rm -rf /tmp/t_$t; mkdir -p /tmp/t_$t; xz -dc $f | tar -x -C /tmp/t_$t; TREES="$TREES $t"; done
for t in $TREES; do mkdir -p /tmp/t_$t/pte_wgpu; ln -sfn /tmp/t_$t/kernels /tmp/t_$t/pte_wgpu/kernels; ln -sfn /tmp/t_$t/resize /tmp/t_$t/pte_wgpu/resize; done
for run in ${ORDER:-old@dawn new@dawn new@dawn old@dawn}; do
  tree=${run%@*} be=${run#*@}; n=$((${n:-0}+1))
  cd /tmp/t_$tree
  PTE_WGPU_BACKEND=$be PYTHONPATH=/tmp/t_$tree:/tmp/site timeout ${SECS:-150} python3 examples/bench_llm.py /tmp/m/$M.pte --params $OLDPWD/$KIT/$M.json --runs ${RUNS:-2} \
    --sessions ${SESSIONS:-1,16,32,64} --batched-only --no-torch ${BENCH_ARGS:-} --json $OUT/${tree}_${be}_$n.json > $OUT/${tree}_${be}_$n.log 2>&1
  echo "== $tree $be $n rc=$? $(( $(date +%s) - t0 )) s"
  python3 -c "
import json; r=json.load(open('$OUT/${tree}_${be}_$n.json'))['wgpu']
print({k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill')) and isinstance(v, (int, float))})" 2>/dev/null || tail -8 $OUT/${tree}_${be}_$n.log
  cd - >/dev/null
done
[ "${PEER:-1}" = 1 ] && peer 2
(cd $OUT && tar -czf raw.tar.gz *.log && rm -f *.log)  # the machine returns few files a call
echo "== all $(( $(date +%s) - t0 )) s"
