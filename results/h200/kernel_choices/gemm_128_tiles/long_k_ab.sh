# The second rule (1,024 rows, N >= 512, K >= 1,536), one call: SmolLM2 prompts and ViT-B/16 before
# (t4: 18e7a12, the first rule alone) and after (t7), two rounds; .ab1b/vit held the ViT exports of
# examples/bench_vision.py export (batch 1 and 8, tiled weights), .ab1b/models the SmolLM2 ones.
VERS="t4 t7" source .ab1b/b1.sh >/dev/null 2>&1
mkdir -p /tmp/vit /tmp/m; [ -f /tmp/vit/manifest.json ] || xz -dc .ab1b/vit/vit.tar.xz | tar -x -C /tmp/vit
for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte; done
for r in 1 2; do for v in t4 t7; do
  for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do
    PYTHONPATH=/tmp/site_$v:/tmp/site timeout 120 python3 examples/bench_llm.py /tmp/m/$M.pte --params .ab1b/models/$M.json --runs 3 --sessions 1 --batched-only --no-torch --json /tmp/ab.json > /tmp/ab.log 2>&1
    python3 -c "
import json; r=json.load(open('/tmp/ab.json'))['wgpu']
print('$v $M', {k: round(v) for k, v in r.items() if k.startswith('prefill') or k.startswith('bursts')})" || tail -3 /tmp/ab.log
  done
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_vision.py run /tmp/vit --models vit_b16 --runs 30 --json $OUT/vit_${v}_$r.json > /tmp/v.log 2>&1
  python3 -c "
import json; r=json.load(open('$OUT/vit_${v}_$r.json'))
print('$v vit', [(x['batch'], round(x['wgpu_ms'], 2), round(x['torch_ms'], 2), x['matches']) for x in r['rows']])" || tail -5 /tmp/v.log
done; done
