# sourced: peer TAG runs llama.cpp's llama-batched-bench on /tmp/m/$G.gguf (S_TG, -npp 128 -ntg 64, NPL streams, flash
# attention on and off) into $OUT, printing each stream count's better run
peer() {
  for fa in on off; do
    timeout 150 /tmp/lc/llamacpp-bin/llama-batched-bench -m /tmp/m/$G.gguf -ngl 99 -fa $fa -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 \
      -npl ${NPL:-1,16,32,64} --output-format jsonl 2>/dev/null | grep '^{' > $OUT/lc_${G}_${fa}_$1.jsonl
  done
  python3 -c "
import json
rows = {}
for fa in ('on', 'off'):
    for line in open('$OUT/lc_${G}_' + fa + '_$1.jsonl'):
        r = json.loads(line); rows[r['pl']] = max(rows.get(r['pl'], 0), r['speed_tg'])
print('llama.cpp $G $1', {k: round(v) for k, v in sorted(rows.items())})"
}
