# usage: VERS="base q3" bash ab1.sh prof|decode ...   (MODEL.pte.xz, MODEL.json: examples/export_bench_model.py --shape llama3_2_1b --qmode 4w)
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl 2>&1 | tail -1
for v in $VERS; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
[ -f /tmp/b1.pte ] || xz -T16 -dc MODEL.pte.xz > /tmp/b1.pte
for what in "$@"; do for round in ${ROUNDS:-1}; do for v in $VERS; do
  case $what in
  prof) echo "== prof $v"; PYTHONPATH=/tmp/site_$v:/tmp/site timeout 150 python3 examples/profile_ragged_decode.py /tmp/b1.pte ${ROWS:-1,16} 2>&1 | grep -v Warn | head -${PROFLINES:-40};;
  decode) PYTHONPATH=/tmp/site_$v:/tmp/site timeout 250 python3 examples/bench_llm.py /tmp/b1.pte --params MODEL.json --runs 3 \
    --sessions ${SESS:-1,16,32,64} --batched-only --no-torch ${EXTRA:-} --json /tmp/ab.json > /tmp/ab.log 2>&1
  python3 -c "
import json; r=json.load(open('/tmp/ab.json'))['wgpu']
print('decode $v', {k: round(v) for k, v in r.items() if k.startswith('bursts') or k.startswith('prefill')})" 2>/dev/null || tail -5 /tmp/ab.log;;
  esac
done; done; done
