# A/B on the device: this checkout (new) against it with one file swapped for its old copy (old), rounds
# old / new / new / old of examples/bench_llm.py. FILE: the file's path in the checkout; OLD: its old copy;
# or OLD_TREE: an older tree instead, a .tar.xz of its async_runtime, kernels, resize and examples
# (`git archive REV async_runtime kernels resize examples | xz`); MODELS: the folder of the model M's
# .pte.xz and .json (examples/export_bench_model.py); WHEELS as the suite's prelude takes it; SESSIONS,
# RUNS, SECS, ORDER.
set -u
source results/h200/suite_on_both_backends/prelude.sh
rm -rf /tmp/site/pte_wgpu  # each tree brings its own
rm -rf /tmp/t_old /tmp/t_new; mkdir -p /tmp/t_old /tmp/t_new
cp -r async_runtime kernels resize examples /tmp/t_new/
if [ -n "${OLD_TREE:-}" ]; then
  xz -dc "$OLD_TREE" | tar -x -C /tmp/t_old
else
  cp -r async_runtime kernels resize examples /tmp/t_old/; cp "$OLD" "/tmp/t_old/$FILE"
fi
for t in old new; do mkdir -p /tmp/t_$t/pte_wgpu; ln -sfn /tmp/t_$t/kernels /tmp/t_$t/pte_wgpu/kernels; ln -sfn /tmp/t_$t/resize /tmp/t_$t/pte_wgpu/resize; done
mkdir -p /tmp/m; M=${M:-llama3_2_1b_synthetic_4w_ctx2048}
[ -f /tmp/m/$M.pte ] || xz -T8 -dc $MODELS/$M.pte.xz > /tmp/m/$M.pte
cp $MODELS/$M.json /tmp/m/
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for tree in ${ORDER:-old new new old}; do
  n=$((${n:-0}+1))
  cd /tmp/t_$tree
  PYTHONPATH=/tmp/t_$tree:/tmp/site timeout ${SECS:-150} python3 examples/bench_llm.py /tmp/m/$M.pte --params /tmp/m/$M.json --runs ${RUNS:-2} \
    --sessions ${SESSIONS:-1,16,64} --batched-only --no-torch --json $OUT/${tree}_$n.json > $OUT/${tree}_$n.log 2>&1
  echo "== $tree $n rc=$?"
  python3 -c "
import json; r=json.load(open('$OUT/${tree}_$n.json'))['wgpu']
print({k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill', 'decode')) and isinstance(v, (int, float))})" 2>/dev/null || tail -5 $OUT/${tree}_$n.log
  cd - >/dev/null
done
