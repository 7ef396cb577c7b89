#!/usr/bin/env bash
# examples/bench_llm.py for each WHEEL:PRECISION of $VERS (a wheel in .pk/ab/WHEEL/, load()'s precision),
# rounds alternating; from the checkout root with .gl/ and .pk/ (the device's layout: ../q4_scales_in_row_quads/ab.sh).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
VERS=${VERS:-half:auto half:f16-sums}
for w in $(for v in $VERS; do echo ${v%%:*}; done | sort -u); do
  [ -d /tmp/w_$w ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/w_$w .pk/whl/*.whl .pk/ab/$w/*.whl 2>&1 | tail -1
done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m
M=${MODEL:-llama1b_fp16}
[ -f /tmp/m/$M.pte ] || xz -T16 -dc .pk/models/$M.pte.xz > /tmp/m/$M.pte
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in ${ROUNDS:-1 2}; do for v in $VERS; do
  w=${v%%:*} p=${v#*:} t0=$(date +%s)
  PYTHONPATH=/tmp/w_$w timeout ${OURS_TIMEOUT:-250} python3 examples/bench_llm.py /tmp/m/$M.pte --params .pk/models/$M.json --runs ${RUNS:-2} \
    --sessions ${SESS:-1,16,32,48,64} --batched-only --no-torch --precision $p --json $OUT/ours_${w}_${p}_$r.json > /tmp/ours_$r.log 2>&1
  echo "== $v round $r rc=$? $(( $(date +%s) - t0 )) s"
  python3 -c "
import json; r=json.load(open('$OUT/ours_${w}_${p}_$r.json'))['wgpu']
print('$v', r['precision'], {k: round(v) for k, v in r.items() if k.startswith('bursts') or k.startswith('prefill')})" 2>/dev/null || tail -30 /tmp/ours_$r.log
done; done
