#!/usr/bin/env bash
# greedy against sampled generation (ar.generate), fp32 and 4w, and the server's default settings at 32 streams;
# run from the checkout root with .gl/ (the Vulkan loader debs), .whl/ (the wheels, this project's built) and .ab/models/ (the exports, xz)
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
mkdir -p /tmp/m
for m in .ab/models/*.pte.xz; do n=/tmp/m/$(basename $m .xz); [ -f $n ] || xz -dc $m > $n; done
cp .ab/models/*.json /tmp/m/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for model in ${MODELS:-smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048}; do
  t0=$(date +%s)
  timeout 240 python3 examples/bench_llm.py /tmp/m/$model.pte --params /tmp/m/$model.json --runs ${RUNS:-3} --sessions ${SESSIONS:-1,16,64} \
    --generate-only --no-torch --json $OUT/generate_$model.json > $OUT/generate_$model.log 2>&1
  echo "== $model rc=$? $(( $(date +%s) - t0 )) s"
  python3 -c "
import json; r=json.load(open('$OUT/generate_$model.json'))['wgpu']
print({k: round(v, 3) if 'over' in k else round(v) for k, v in r.items() if isinstance(v, (int, float))})" 2>/dev/null || tail -20 $OUT/generate_$model.log
done
if [ -n "${SERVING:-1}" ]; then
  t0=$(date +%s)
  timeout 200 python3 -m async_runtime.tools.bench.serving /tmp/m/smollm2_synthetic_fp32_ctx2048.pte --tokenizer .ab/tokenizer.json \
    --streams ${STREAMS:-32} --requests 2 --max-tokens 128 --rounds 2 --sampling default,chat --json $OUT/serving_fp32.json > $OUT/serving_fp32.log 2>&1
  echo "== serving rc=$? $(( $(date +%s) - t0 )) s"; grep streams: $OUT/serving_fp32.log || tail -20 $OUT/serving_fp32.log
fi
