#!/usr/bin/env bash
# llama.cpp, ours before, ours after, llama.cpp: one call. From the checkout root with .gl/ and .pk/;
# BENCH_ARGS: more arguments for examples/bench_llm.py (--precision f16-sums); VERS: wheels' folders, each as FOLDER@BACKEND for another backend.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
for v in ${VERS:-before after}; do w=${v%@*}; [ -d /tmp/w_$w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/w_$w .pk/whl/*.whl .pk/ab/$w/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m /tmp/lc
M=${MODEL:-llama1b_4w}
[ -f /tmp/m/$M.pte ] || xz -T16 -dc .pk/models/$M.pte.xz > /tmp/m/$M.pte
G=/tmp/m/${GGUF:-llama1b-q4_0}.gguf
[ -f $G ] || xz -T16 -dc .pk/models/$(basename $G).xz > $G
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc .pk/bin/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
peer() {  # $1: round
  timeout 150 /tmp/lc/llamacpp-bin/llama-bench -m $G -ngl 99 -fa 0,1 -p 512,2048 -n 128 -r ${REPS:-2} -o json > $OUT/llamacpp_bench_$1.json 2>/dev/null
  for fa in on off; do
    timeout 150 /tmp/lc/llamacpp-bin/llama-batched-bench -m $G -ngl 99 -fa $fa -c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,16,32,64 \
      --output-format jsonl 2>/dev/null | grep '^{' > $OUT/llamacpp_batched_${fa}_$1.jsonl
  done
  python3 - $OUT $1 <<'PY'
import json, sys
out, r = sys.argv[1], sys.argv[2]
rows = {}
for run in json.load(open(f"{out}/llamacpp_bench_{r}.json")):
    key = f"prefill_{run['n_prompt']}" if run["n_gen"] == 0 else "decode_1"
    rows[key] = max(rows.get(key, 0), run["avg_ts"])
for fa in ("on", "off"):
    for line in open(f"{out}/llamacpp_batched_{fa}_{r}.jsonl"):
        run = json.loads(line)
        rows[f"batched_{run['pl']}"] = max(rows.get(f"batched_{run['pl']}", 0), run["speed_tg"])
print("llama.cpp", {k: round(v) for k, v in sorted(rows.items())})
PY
}
ours() {  # $1: the wheel's folder in .pk/ab (before / after), or FOLDER@BACKEND ($PTE_WGPU_BACKEND: dawn)
  t0=$(date +%s) w=${1%@*} be=wgpu-native
  [ "$w" = "$1" ] || be=${1#*@}
  PTE_WGPU_BACKEND=$be PYTHONPATH=/tmp/w_$w timeout ${OURS_TIMEOUT:-200} python3 examples/bench_llm.py /tmp/m/$M.pte --params .pk/models/$M.json --runs ${RUNS:-2} --sessions ${SESS:-1,16,32,64} \
    --batched-only --no-torch ${BENCH_ARGS:-} --json $OUT/ours_${1/@/_}$2.json > /tmp/ours_$1$2.log 2>&1
  echo "== ours $1 rc=$? $(( $(date +%s) - t0 )) s"
  python3 -c "
import json; r=json.load(open('$OUT/ours_${1/@/_}$2.json'))['wgpu']
print('$1', {k: round(v) for k, v in r.items() if k.startswith('bursts') or k.startswith('prefill')})" 2>/dev/null || tail -30 /tmp/ours_$1$2.log
}
[ "${PEER:-1}" = 1 ] && peer 1
for r in ${ROUNDS:-1}; do for v in ${VERS:-before after}; do ours $v _$r; done; done
[ "${PEER:-1}" = 1 ] && [ "${PEER2:-1}" = 1 ] && peer 2
true
