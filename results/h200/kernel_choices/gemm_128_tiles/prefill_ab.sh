# The A/B of one call: the tile bench (this folder's gemm_tiles.py, then in .ab1b/), then the
# Llama-3.2-1B 4w export's prompts and one stream, before (f1) and after (t2), two rounds. .ab1b/b1.sh
# installs wgpu-py and each candidate's wheel and unpacks the export, as ../q4_subgroup_17_64/ab1.sh does.
VERS="f1 t2" source .ab1b/b1.sh
PYTHONPATH=/tmp/site_t2:/tmp/site timeout 300 python3 .ab1b/gemmbench.py 2>&1 | grep -v Warn > $OUT/gemm2.txt
for r in 1 2; do for v in f1 t2; do
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_llm.py /tmp/b1.pte --params .ab1b/models/llama1b_4w.json --runs 3 --sessions 1 --batched-only --no-torch --json /tmp/ab.json > /tmp/ab.log 2>&1
  python3 -c "
import json; r=json.load(open('/tmp/ab.json'))['wgpu']
print('$v', {k: round(v) for k, v in r.items() if k.startswith('bursts') or k.startswith('prefill')})" || tail -5 /tmp/ab.log
done; done
