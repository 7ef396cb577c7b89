# On the device: the NaN, clamp and scatter tests on both backends, then the int8 GEMM with and without Dawn's workgroup-init toggle. STORE: an export store.
source "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=$PWD/$STORE
for be in wgpu dawn; do
  [ $be = dawn ] && export PTE_WGPU_BACKEND=dawn
  timeout 100 python3 -m pytest -q -p no:cacheprovider -rfE -k "not trio" tests/test_validation.py tests/test_more_ops.py tests/test_scatter_ops.py tests/test_sampling.py tests/test_reduce_ops.py > $OUT/nan_$be.log 2>&1
  echo "== $be"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/nan_$be.log | grep -vE "No module named '(torchao|executorch)'" | tail -12
done
unset PTE_WGPU_BACKEND
cd results/h100/int8_subgroup_matrix_gemm
for t in "" disable_workgroup_init disable_workgroup_init; do echo "toggles: $t"; NOROBUST=1 TOGGLES=$t timeout 60 python3 i8gemm.py 2,2,4,4,32,4,16,1,4 2,2,4,4,32 2>&1 | grep "^cfg"; done
