#!/usr/bin/env bash
# The hybrid families' real-shape exports (.hyb/*.pte.xz with their .json, and the lavapipe run's logits
# where there is one, *.ref.npz; .hyb/whl: this code's wheel): load, generate, check (hybrid_check.py), bench one and 16 streams.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl .hyb/whl/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp PYTHONPATH=/tmp/site
mkdir -p /tmp/hyb
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for x in .hyb/*.pte.xz; do
  n=$(basename $x .pte.xz); p=/tmp/hyb/$n.pte
  [ -f $p ] || xz -T16 -dc $x > $p
  if [ -f .hyb/$n.ref.npz ]; then ref=.hyb/$n.ref.npz; else ref=/tmp/hyb/$n.none.npz; fi
  timeout 240 python3 results/h200/families/hybrid_check.py $p $ref $([ -f .hyb/$n.ref.npz ] || echo --save) 2>&1 | grep -v Warn | tail -3
  timeout 200 python3 examples/bench_llm.py $p --params .hyb/$n.json --runs 2 --sessions 1,16 --batched-only --no-torch --json $OUT/ours_$n.json > /tmp/hyb/$n.log 2>&1
  python3 -c "
import json; r=json.load(open('$OUT/ours_$n.json'))['wgpu']
print('$n', {k: (round(v, 2) if isinstance(v, float) and v < 10 else round(v)) if isinstance(v, (int, float)) else v for k, v in r.items() if k.startswith(('load_s', 'bursts', 'prefill_512', 'prefill_2047', 'batching', 'model_memory'))})" 2>/dev/null || tail -5 /tmp/hyb/$n.log
done
