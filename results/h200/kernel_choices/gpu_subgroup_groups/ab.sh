# usage: VERS="old new" MODELS="fp32 4w" [ROUNDS="1 2"] bash ab.sh prof|ttft|decode ...  (wheels in .b8/v/VERSION/, SmolLM2-shaped exports in .ab1b/models/)
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl 2>&1 | tail -1
for v in $VERS; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m
for q in $MODELS; do M=smollm2_synthetic_${q}_ctx2048; [ -f /tmp/m/$M.pte ] || xz -T16 -dc .ab1b/models/$M.pte.xz > /tmp/m/$M.pte; done
for what in "$@"; do for q in $MODELS; do M=smollm2_synthetic_${q}_ctx2048; for round in ${ROUNDS:-1}; do for v in $VERS; do
  case $what in
  prof) echo "== prof $q $v"; PYTHONPATH=/tmp/site_$v:/tmp/site timeout 100 python3 results/h200/kernel_choices/gpu_subgroup_groups/prof_cached.py /tmp/m/$M.pte 2>&1 | grep -v Warn | head -${PROFLINES:-9};;
  ttft) echo "== ttft $q $v"; PYTHONPATH=/tmp/site_$v:/tmp/site timeout 100 python3 examples/bench_prefix_cache.py /tmp/m/$M.pte --system 1024 --user 32 --requests ${REQ:-12} 2>&1 | grep -i "time to first\|DIFFERENT\|Error";;
  decode) PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_llm.py /tmp/m/$M.pte --params .ab1b/models/$M.json --runs 3 \
    --sessions ${SESS:-1,16,32,64} --batched-only --no-torch --json /tmp/ab.json > /tmp/ab.log 2>&1
  python3 -c "
import json; r=json.load(open('/tmp/ab.json'))['wgpu']
print('decode $q $v', {k: round(v) for k, v in r.items() if k.startswith('bursts') or k.startswith('prefill')})" 2>/dev/null || tail -3 /tmp/ab.log;;
  esac
done; done; done; done
