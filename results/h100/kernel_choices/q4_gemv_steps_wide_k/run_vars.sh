#!/usr/bin/env bash
# variants of the 4-bit GEMV against each other, Llama-3.2-1B shape 4w, bursts at 1 and 16 streams
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
for v in $VARS; do
  rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v $(ls .whl1b/*.whl | grep -v pte_wgpu) .ab1b/v/$v/*.whl 2>&1 | tail -1
done
mkdir -p /tmp/m; M=${MODEL:-llama3_2_1b_synthetic_4w_ctx2048}
[ -f /tmp/m/$M.pte ] || xz -T4 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte
cp .ab1b/models/$M.json /tmp/m/
[ -n "${CHECK:-}" ] && for v in $CHECK; do echo "check $v"; PYTHONPATH=/tmp/site_$v timeout 120 python3 .ab1b/check/check.py .ab1b/check 2>&1 | grep -v Warn | tail -3; done
for round in ${ROUNDS:-1}; do
  for v in $VARS; do
    PYTHONPATH=/tmp/site_$v timeout 200 python3 examples/bench_llm.py /tmp/m/$M.pte --params /tmp/m/$M.json --runs ${RUNS:-2} \
      --sessions ${SESSIONS:-1,16} --batched-only --no-torch --json /tmp/${v}_$round.json > /tmp/${v}_$round.log 2>&1
    python3 -c "
import json; r=json.load(open('/tmp/${v}_$round.json'))['wgpu']
print('$v', $round, {k: round(v) for k, v in r.items() if k.startswith(('bursts', 'prefill_32')) and isinstance(v, (int, float))})" 2>/dev/null || tail -5 /tmp/${v}_$round.log
  done
done
