# usage: VERS="before after" bash models_ab.sh   prompts (SmolLM2 fp32 / 4w, Llama-3.2-1B 4w) and ViT-B/16, two rounds
# (.ab1b/models: the bench exports as xz; .ab1b/vit: examples/bench_vision.py export of vit_b16, batch 1 and 8)
VERS="$VERS" source .ab1b/b1.sh >/dev/null 2>&1
mkdir -p /tmp/vit /tmp/m; [ -f /tmp/vit/manifest.json ] || xz -dc .ab1b/vit/vit.tar.xz | tar -x -C /tmp/vit
for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte; done
cp -n .ab1b/models/llama1b_4w.json /tmp/m/b1.json; ln -sf /tmp/b1.pte /tmp/m/b1.pte
for r in 1 2; do for v in $VERS; do
  for M in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048 b1; do
    J=.ab1b/models/$M.json; [ $M = b1 ] && J=/tmp/m/b1.json
    PYTHONPATH=/tmp/site_$v:/tmp/site timeout 120 python3 examples/bench_llm.py /tmp/m/$M.pte --params $J --runs 3 --sessions 1 --batched-only --no-torch --json $OUT/llm_${v}_${M}_$r.json > /tmp/ab.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/llm_${v}_${M}_$r.json'))['wgpu']
print('$v $M', {k: round(v) for k, v in r.items() if k.startswith('prefill') or k.startswith('bursts')})" || tail -3 /tmp/ab.log
  done
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_vision.py run /tmp/vit --models vit_b16 --runs 30 --json $OUT/vit_${v}_$r.json > /tmp/v.log 2>&1
  python3 -c "
import json; r=json.load(open('$OUT/vit_${v}_$r.json'))
print('$v vit', [(x['batch'], round(x['wgpu_ms'], 2), round(x['torch_ms'], 2), x['matches']) for x in r['rows']])" || tail -5 /tmp/v.log
done; done
