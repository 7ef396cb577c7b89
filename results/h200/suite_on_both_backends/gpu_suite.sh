# On the device: the suite over an export store STORE (a folder under the checkout), on the backend $1 (wgpu or dawn); $2: seconds; more arguments go to pytest.
source "$(dirname "$0")/prelude.sh"
export PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=$PWD/$STORE PYTHONUNBUFFERED=1
[ "$1" = dawn ] && export PTE_WGPU_BACKEND=dawn
python3 -c "import pte_wgpu.kernels, async_runtime; print('ok')" 2>&1 | tail -1
BACKEND=$1; shift; secs=$1; shift
timeout $secs python3 -m pytest -v -p no:cacheprovider -rfE --durations=5 --continue-on-collection-errors --ignore tests/test_soak.py --ignore tests/test_cluster.py --ignore tests/test_packaging.py "$@" > $OUT/suite_$BACKEND.log 2>&1; grep -E "FAILED|ERROR|passed|failed" $OUT/suite_$BACKEND.log | tail -40
