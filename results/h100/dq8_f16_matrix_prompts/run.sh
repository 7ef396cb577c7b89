#!/usr/bin/env bash
# 8da4w prompts on f16 subgroup matrices against the int8 ones and the GEMM, all on Dawn, and llama.cpp's Q4_0
# (llama-bench, before and after ours). On the GPU machine from the checkout root: KIT holds NAME.pte.xz (M,
# an examples/export_bench_model.py --qmode 8da4w export), llama1b-q4_0.gguf.xz and llamacpp-bin.tar.xz; STORE
# the tests' stored exports (tests/test_int8_matrix.py's, test_llama's 8da4w, tests/test_fp16_linear.py's), tar.xz; AO a tar.xz of torchao's
# Python files (the machine has none: the quantized cases' eager modules).
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
M=${M:-llama3_2_1b_synthetic_dq8a4w_ctx2048} G=${G:-llama1b-q4_0} HERE=results/h200/int8_matrix_prompts
mkdir -p /tmp/m /tmp/lc /tmp/store
[ -f /tmp/m/$M.pte ] || xz -T16 -dc $KIT/$M.pte.xz > /tmp/m/$M.pte
[ -f /tmp/m/$G.gguf ] || xz -dc $KIT/$G.gguf.xz > /tmp/m/$G.gguf
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc $KIT/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
tar -xJf $STORE -C /tmp/store
mkdir -p /tmp/ao && tar -xJf $AO -C /tmp/ao
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=/tmp/store PYTHONPATH=$PYTHONPATH:/tmp/ao timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs \
    tests/test_int8_matrix.py tests/test_llama.py tests/test_batching.py -k "int8 or matrices or 8da4w" > $OUT/tests_dawn.log 2>&1
  echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests_dawn.log | tail -25
  # the f16 matrices' tiles of fp16 exports (their decode rows' tiles)
  PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=/tmp/store PYTHONPATH=$PYTHONPATH:/tmp/ao timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs \
    tests/test_fp16_linear.py -k "matrices or match_eager" > $OUT/tests_fp16_dawn.log 2>&1
  echo "== fp16 tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests_fp16_dawn.log | tail -25
fi
peer() { timeout 150 /tmp/lc/llamacpp-bin/llama-bench -m /tmp/m/$G.gguf -ngl 99 -fa 0,1 -p 512,2048 -n 0 -r 3 -o md 2>/dev/null | grep -E "pp"; }
[ "${PEER:-1}" = 1 ] && { echo "== llama.cpp 1"; peer; }
# ROUTES: ROUTE[@TREE], ROUTE f16, int8 or gemm; TREE this checkout, or tree_TREE.tar.xz of $TREES_DIR
for run in ${ROUTES:-f16 int8 gemm f16}; do
  cfg=${run%@*} tree=${run#*@}; [ "$tree" = "$run" ] && tree=new
  case $cfg in f16) flags="";; int8) flags="--no-f16-matrices";; gemm) flags="--no-f16-matrices --no-matrices";; esac
  dir=$PWD
  if [ $tree != new ]; then
    dir=/tmp/t_$tree; [ -d $dir ] || { mkdir -p $dir/pte_wgpu && xz -dc $TREES_DIR/tree_$tree.tar.xz | tar -x -C $dir && ln -sfn $dir/kernels $dir/pte_wgpu/kernels && ln -sfn $dir/resize $dir/pte_wgpu/resize; }
  fi
  echo "== ours $cfg@$tree $(( $(date +%s) - t0 )) s"
  (cd $dir && PTE_WGPU_BACKEND=dawn PYTHONPATH=$dir:/tmp/site timeout 150 python3 $OLDPWD/$HERE/prefill.py /tmp/m/$M.pte $flags --sizes ${SIZES:-512,2047} \
    --runs ${RUNS:-3} --decode 16 2>&1 | tail -4)
done
[ "${PEER:-1}" = 1 ] && { echo "== llama.cpp 2"; peer; }
echo "== all $(( $(date +%s) - t0 )) s"
