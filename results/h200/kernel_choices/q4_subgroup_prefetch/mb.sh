# usage (layout as ab.sh): VERS="m0 p2" bash mb.sh ROWS MODE SHAPES   (q4bench.py under each wheel)
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl1b/*.whl
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
for v in $VERS; do rm -rf /tmp/site_$v; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl; echo "== $v"; PYTHONPATH=/tmp/site_$v:/tmp/site python3 results/h200/kernel_choices/q4_subgroup_prefetch/q4bench.py "$@" 2>&1 | grep -v Warn; done
