# usage, from the checkout root with .gl/ (the Vulkan loader debs), .whl1b/ (wgpu-py and its dependencies),
# .b8/v/NAME/ (a pte_wgpu wheel per candidate) and .ab1b/models/ (MODEL.pte.xz, MODEL.json):
#   VERS="m0 p2" [ROUNDS="1 2"] [SESS=1,4,16] [MODEL=.ab1b/models/llama1b_4w] bash ab.sh prof|decode ...
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl 2>&1 | tail -1
for v in $VERS; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
M=${MODEL:-.ab1b/models/llama1b_4w}; T=/tmp/$(basename $M).pte
[ -f $T ] || xz -T16 -dc $M.pte.xz > $T
for what in "$@"; do for round in ${ROUNDS:-1}; do for v in $VERS; do
  case $what in
  prof) echo "== prof $v"; PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/profile_ragged_decode.py $T ${ROWS:-1,16} ${PEXTRA:-} 2>&1 | grep -v Warn | head -${PROFLINES:-60};;
  decode) PYTHONPATH=/tmp/site_$v:/tmp/site timeout 300 python3 examples/bench_llm.py $T --params $M.json --runs ${RUNS:-3} \
    --sessions ${SESS:-1,16,32,64} --batched-only --no-torch ${EXTRA:-} --json /tmp/ab.json > /tmp/ab.log 2>&1
  python3 -c "
import json; r=json.load(open('/tmp/ab.json'))['wgpu']
print('decode $v', {k: round(v) for k, v in r.items() if k.startswith('bursts') or k.startswith('prefill')})" 2>/dev/null || tail -5 /tmp/ab.log;;
  esac
done; done; done
