#!/usr/bin/env bash
# the GEMV's lanes at K >= 2,048: variants against the wheel before, Llama-3.2-1B shape 4w
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
for v in before_whl var_2 var_4 var_8; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v $(ls .whl1b/*.whl | grep -v pte_wgpu) .ab1b/$v/*.whl 2>&1 | tail -1
done
mkdir -p /tmp/m; M=llama3_2_1b_synthetic_4w_ctx2048
[ -f /tmp/m/$M.pte ] || xz -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
cp .ab1b/models/$M.json /tmp/m/
for round in 1 2; do
  order="before_whl var_2 var_4 var_8"; [ $round = 2 ] && order="var_8 var_4 var_2 before_whl"
  for v in $order; do
    PYTHONPATH=/tmp/site_$v timeout 120 python3 examples/bench_llm.py /tmp/m/$M.pte --params /tmp/m/$M.json --runs 3 \
      --sessions 1,16 --batched-only --no-torch --json $OUT/${v}_$round.json > $OUT/${v}_$round.log 2>&1
    echo "== $v round $round rc=$?"
    python3 -c "
import json; r=json.load(open('$OUT/${v}_$round.json'))['wgpu']
print({k: round(v) for k, v in r.items() if k.startswith(('bursts', 'decode_tok', 'prefill_32')) and isinstance(v, (int, float))})" 2>/dev/null || tail -5 $OUT/${v}_$round.log
  done
done
