#!/usr/bin/env bash
# the code before GPU sampling (its wheel in .ab/before_whl) under the same generate bench, then this checkout again
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
mkdir -p /tmp/site_before
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_before $(ls .whl/*.whl | grep -v pte_wgpu) .ab/before_whl/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m
for m in .ab/models/*.pte.xz; do n=/tmp/m/$(basename $m .xz); [ -f $n ] || xz -dc $m > $n; done
cp .ab/models/*.json /tmp/m/
for model in smollm2_synthetic_fp32_ctx2048 smollm2_synthetic_4w_ctx2048; do
  for tree in before after; do
    site=/tmp/site; [ $tree = before ] && site=/tmp/site_before
    t0=$(date +%s)
    PYTHONPATH=$site timeout 200 python3 examples/bench_llm.py /tmp/m/$model.pte --params /tmp/m/$model.json --runs 3 --sessions 1,16,64 \
      --generate-only --no-torch --json $OUT/${tree}_$model.json > $OUT/${tree}_$model.log 2>&1
    echo "== $tree $model rc=$? $(( $(date +%s) - t0 )) s"
    python3 -c "
import json; r=json.load(open('$OUT/${tree}_$model.json'))['wgpu']
print({k: round(v, 3) if 'over' in k else round(v) for k, v in r.items() if isinstance(v, (int, float)) and 'memory' not in k})" 2>/dev/null || tail -5 $OUT/${tree}_$model.log
  done
done
