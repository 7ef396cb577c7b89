# The test suite on the GPU machine, on both backends at once: BACKENDS, FILES, N (xdist workers each), T (seconds).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .pk/whl/*.whl .pf3/whl/*.whl 2>&1 | tail -2
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
mkdir -p /tmp/pp; ln -sfn $PWD /tmp/pp/pte_wgpu
[ -d /tmp/store ] || { mkdir -p /tmp/store; cat .pf3/store.tar.xz.* | xz -T16 -dc | tar -x -C /tmp/store; }
export PYTHONPATH=/tmp/site:$PWD:/tmp/pp:$PWD/.pf2/torchao:$PWD/.pf3 PTE_WGPU_EXPORT_DIR=/tmp/store PTE_WGPU_REQUIRE_ADAPTER=1
python3 -c "import pytest, xdist; print('pytest', pytest.__version__, 'xdist', xdist.__version__)"
run() {
  FAILLOG=$OUT/fail_$1.txt PTE_WGPU_BACKEND=$1 timeout ${T:-540} python3 -m pytest -q -p no:cacheprovider -n ${N:-6} -p failures --timeout=${TT:-150} -W ignore::SyntaxWarning ${FILES:-tests} -rfEs \
    --junitxml=$OUT/junit_$1.xml > $OUT/log_$1.txt 2>&1
  echo "== $1 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/log_$1.txt | tail -60
}
for b in ${BACKENDS:-wgpu-native dawn}; do run $b > /tmp/summary_$b.txt 2>&1 & done; wait
cat /tmp/summary_*.txt
