for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl 2>&1 | tail -1
for v in $VERS; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/vitm; cp .vit/manifest.json /tmp/vitm/; for f in .vit/*.xz; do [ -f /tmp/vitm/$(basename $f .xz) ] || xz -dc $f > /tmp/vitm/$(basename $f .xz); done
for round in ${ROUNDS:-1}; do for v in $VERS; do echo "== $v round $round"
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 200 python3 examples/bench_vision.py run /tmp/vitm --models vit_b16 --runs ${RUNS:-30} $EXTRA 2>&1 | grep -v Warn | grep "vit\|    "
done; done
