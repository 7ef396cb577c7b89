#!/usr/bin/env bash
# SmolLM2 shape, fp32 and 4w, against llama.cpp F32 and Q4_0 (the peer kit), llama.cpp before and after ours, one call
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
mkdir -p /tmp/m /tmp/peers; cp -r .peers/llamacpp /tmp/peers/
for m in .absm/models/*.pte.xz; do n=/tmp/m/$(basename $m .xz); [ -f $n ] || xz -dc $m > $n; done
cp .absm/models/*.json /tmp/m/
peer() {
  MODELS="f32 q4_0" BATCHED_MODELS="f32 q4_0" REPS=3 BB_ARGS="-c 16384 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,16,32,64" \
    OUT=/tmp/peer_$1 timeout 280 bash /tmp/peers/llamacpp/run.sh > /dev/null 2>&1
  echo "== llama.cpp round $1 rc=$?"
  python3 - /tmp/peer_$1 $OUT/llamacpp_$1.json <<'PY'
import glob, json, os, sys
out, dest = sys.argv[1], sys.argv[2]
rows = {}
for m in ("f32", "q4_0"):
    r = rows.setdefault(m, {})
    try:
        runs = json.load(open(f"{out}/llamacpp_{m}.json"))
    except (OSError, ValueError):
        runs = []
    for run in runs:
        key = f"prefill_{run['n_prompt']}" if run["n_gen"] == 0 else "decode_1"
        r[key] = max(r.get(key, 0), run["avg_ts"])
    for path in glob.glob(f"{out}/llamacpp_batched_{m}_fa*.jsonl"):
        for line in open(path):
            run = json.loads(line)
            r[f"decode_{run['pl']}"] = max(r.get(f"decode_{run['pl']}", 0), run["speed_tg"])
print("llama.cpp", {m: {k: round(v) for k, v in sorted(r.items())} for m, r in rows.items()})
json.dump(rows, open(dest, "w"))
PY
}
peer 1
for model in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do
  timeout 200 python3 examples/bench_llm.py /tmp/m/$model.pte --params /tmp/m/$model.json --runs 3 --sessions 16,32,64 \
    --batched-only --no-torch --json $OUT/ours_$model.json > /tmp/ours_$model.log 2>&1
  echo "== ours $model rc=$?"
  python3 -c "
import json; r=json.load(open('$OUT/ours_$model.json'))['wgpu']
print({k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill_512', 'prefill_2047')) and isinstance(v, (int, float))})" 2>/dev/null || tail -5 /tmp/ours_$model.log
done
peer 2
