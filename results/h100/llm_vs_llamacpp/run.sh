#!/usr/bin/env bash
# Exports against llama.cpp GGUFs of the same shapes on one GPU in one call: llama.cpp's bench tools
# before and after ours, its better run per row. Run from the checkout root on the GPU machine with
# .gl/ (the Vulkan loader's debs), WHEELS (wgpu-py and its dependencies) and KIT: each export as
# NAME.pte.xz with its NAME.json, each GGUF as G.gguf.xz, llama.cpp's llamacpp-bin.tar.xz (the peer
# kit's bin/). PAIRS: "NAME:G ..." (an export and the GGUF it is compared with); BACKENDS: ours on
# each of these ("wgpu-native", "dawn": WHEELS then holds wgpudawn too).
set -u
. results/h200/suite_on_both_backends/prelude.sh
KIT=${KIT:-.bm/kit}
mkdir -p /tmp/m /tmp/lc
for f in $KIT/*.xz; do n=/tmp/m/$(basename $f .xz); [ -f $n ] || xz -T16 -dc $f > $n; done
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || tar -xf /tmp/m/llamacpp-bin.tar -C /tmp/lc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
LC=/tmp/lc/llamacpp-bin

peer() {  # $1: round
  for pair in $PAIRS; do
    g=${pair#*:}
    timeout 150 $LC/llama-bench -m /tmp/m/$g.gguf -ngl 99 -fa 0,1 -p 512,2048 -n 128 -r ${REPS:-2} -o json \
      > $OUT/lc_bench_${g}_$1.json 2>$OUT/lc_bench_${g}_$1.log
    for fa in on off; do
      timeout 150 $LC/llama-batched-bench -m /tmp/m/$g.gguf -ngl 99 -fa $fa -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 \
        -npl 1,16,32,64 --output-format jsonl 2>$OUT/lc_batched_${g}_${fa}_$1.log | grep '^{' > $OUT/lc_batched_${g}_${fa}_$1.jsonl
    done
    python3 - $OUT $g $1 <<'PY'
import json, sys
out, g, r = sys.argv[1:]
rows = {}
try:
    for run in json.load(open(f"{out}/lc_bench_{g}_{r}.json")):
        key = f"prefill_{run['n_prompt']}" if run["n_gen"] == 0 else "decode_1"
        rows[key] = max(rows.get(key, 0), run["avg_ts"])
except (OSError, ValueError) as e:
    print("llama-bench:", e)
for fa in ("on", "off"):
    for line in open(f"{out}/lc_batched_{g}_{fa}_{r}.jsonl"):
        run = json.loads(line)
        rows[f"batched_{run['pl']}"] = max(rows.get(f"batched_{run['pl']}", 0), run["speed_tg"])
print(f"llama.cpp round {r} {g}", {k: round(v) for k, v in sorted(rows.items())})
PY
  done
}

ours() {
  for pair in $PAIRS; do
    for backend in ${BACKENDS:-wgpu-native}; do
      m=${pair%%:*}
      r=ours_${m}$([ $backend = wgpu-native ] || echo _$backend)
      t0=$(date +%s)
      PTE_WGPU_BACKEND=$backend timeout ${OURS_TIMEOUT:-200} python3 examples/bench_llm.py /tmp/m/$m.pte --params $KIT/$m.json \
        --runs 3 --sessions ${SESSIONS:-1,16,32,64} --batched-only --no-torch --json $OUT/$r.json > $OUT/$r.log 2>&1
      echo "== $r rc=$? $(( $(date +%s) - t0 )) s"
      python3 -c "
import json; r=json.load(open('$OUT/$r.json'))['wgpu']
print('$r', {k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill')) and isinstance(v, (int, float))})" \
        2>/dev/null || tail -30 $OUT/$r.log
    done
  done
}

peer 1
ours
peer 2
# the device returns few files a call: the raw files go in one archive
(cd $OUT && tar -czf raw.tar.gz lc_* ours_*.log && rm -f lc_* ours_*.log)
