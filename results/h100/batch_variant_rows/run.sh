#!/usr/bin/env bash
# GPU machine: Dawn tests of test_fp16_linear (STORE, AO), then per model of MODELS ("M:G ..."): llama.cpp's batched
# bench (PROMPTS=1: and llama-bench's prompts), ours under RUNS_ORDER (inv|var ...: load(batch_invariant=True|False)),
# llama.cpp again; SAME=1: same_tokens.py.
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
mkdir -p /tmp/ao && tar -xJf $AO -C /tmp/ao
if [ "${TESTS:-1}" = 1 ]; then
  PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=$PWD/$STORE PYTHONPATH=/tmp/site:$PWD:/tmp/ao timeout 240 \
    python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_fp16_linear.py -k "asyncio and (matrices or match_eager or batch_variant)" > $OUT/tests_dawn.log 2>&1
  echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests_dawn.log | tail -25
fi
mkdir -p /tmp/m /tmp/lc
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc $KIT/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
peer() {  # llama-batched-bench's S_TG, flash attention on and off, the better per row; PROMPTS=1: llama-bench's prompts too
  if [ "${PROMPTS:-0}" = 1 ]; then
    timeout 150 /tmp/lc/llamacpp-bin/llama-bench -m /tmp/m/$G.gguf -ngl 99 -fa 0,1 -p 512,2048 -n 0 -r 2 -o json > $OUT/lc_${M}_bench_$1.jsonl 2>/dev/null
    python3 -c "
import json
rows = {}
for run in json.load(open('$OUT/lc_${M}_bench_$1.jsonl')):
    rows[run['n_prompt']] = max(rows.get(run['n_prompt'], 0), run['avg_ts'])
print('llama.cpp prompts $1', {k: round(v) for k, v in sorted(rows.items())})"
  fi
  for fa in on off; do
    timeout 120 /tmp/lc/llamacpp-bin/llama-batched-bench -m /tmp/m/$G.gguf -ngl 99 -fa $fa -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 \
      -npl ${NPL:-1,8,16,32,64} --output-format jsonl 2>/dev/null | grep '^{' > $OUT/lc_${M}_${fa}_$1.jsonl
  done
  python3 -c "
import json
rows = {}
for fa in ('on', 'off'):
    for line in open('$OUT/lc_${M}_' + fa + '_$1.jsonl'):
        r = json.loads(line); rows[r['pl']] = max(rows.get(r['pl'], 0), r['speed_tg'])
print('llama.cpp $1', {k: round(v) for k, v in sorted(rows.items())})"
}
for mg in $MODELS; do
  M=${mg%:*} G=${mg#*:}
  [ -s /tmp/m/$M.pte ] || xz -T16 -dc $KIT/$M.pte.xz > /tmp/m/$M.pte
  [ -s /tmp/m/$G.gguf ] || xz -dc $KIT/$G.gguf.xz > /tmp/m/$G.gguf
  echo "== $M"
  [ "${PEER:-1}" = 1 ] && peer 1
  n=0
  for mode in ${RUNS_ORDER:-inv var var inv}; do
    n=$((n+1)); flag=""; [ $mode = var ] && flag=--batch-variant
    PTE_WGPU_BACKEND=dawn timeout ${SECS:-150} python3 examples/bench_llm.py /tmp/m/$M.pte --params $KIT/$M.json --runs ${RUNS:-1} \
      --sessions ${SESSIONS:-1,8,16,32,64} --batched-only --no-torch $flag --json $OUT/${M}_${mode}_$n.json > $OUT/${M}_${mode}_$n.log 2>&1
    echo "== $mode $n rc=$? $(( $(date +%s) - t0 )) s"
    python3 -c "
import json; r=json.load(open('$OUT/${M}_${mode}_$n.json'))['wgpu']
print(r.get('batch_invariant'), {k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill')) and isinstance(v, (int, float))})" 2>/dev/null || tail -8 $OUT/${M}_${mode}_$n.log
  done
  [ "${PEER:-1}" = 1 ] && peer 2
  if [ "${SAME:-0}" = 1 ]; then PTE_WGPU_BACKEND=dawn timeout 200 python3 results/h100/batch_variant_rows/same_tokens.py /tmp/m/$M.pte 16 24 2>&1 | tail -3; fi
done
(cd $OUT && tar -czf raw.tar.gz *.log *.jsonl && rm -f *.log *.jsonl)
echo "== all $(( $(date +%s) - t0 )) s"
