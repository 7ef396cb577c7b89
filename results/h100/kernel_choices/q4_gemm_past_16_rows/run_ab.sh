#!/usr/bin/env bash
# A/B: the wheel in .ab1b/before_whl against this checkout's (.whl1b), Llama-3.2-1B shape 4w, two rounds
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_new .whl1b/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_old $(ls .whl1b/*.whl | grep -v pte_wgpu) .ab1b/before_whl/*.whl 2>&1 | tail -1
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m; M=llama3_2_1b_synthetic_4w_ctx2048
[ -f /tmp/m/$M.pte ] || xz -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
cp .ab1b/models/$M.json /tmp/m/
for round in 1 2; do
  for tree in old new; do
    [ $round = 2 ] && tree=$([ $tree = old ] && echo new || echo old)
    PYTHONPATH=/tmp/site_$tree timeout 200 python3 examples/bench_llm.py /tmp/m/$M.pte --params /tmp/m/$M.json --runs 3 \
      --sessions 1,16,32,64 --batched-only --no-torch --json $OUT/${tree}_$round.json > $OUT/${tree}_$round.log 2>&1
    echo "== $tree round $round rc=$?"
    python3 -c "
import json; r=json.load(open('$OUT/${tree}_$round.json'))['wgpu']
print({k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill')) and isinstance(v, (int, float))})" 2>/dev/null || tail -5 $OUT/${tree}_$round.log
  done
done
