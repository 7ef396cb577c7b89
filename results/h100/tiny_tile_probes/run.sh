#!/usr/bin/env bash
# one call: per-dispatch profiles of 16-row passes under TINY tile shapes and probes, whole-step passes head vs new; the f16 matrices' GPU tests last
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
M=llama3_2_1b_synthetic_4w_fp16_ctx2048
mkdir -p /tmp/m; [ -f /tmp/m/$M.pte ] || xz -T16 -dc $KIT/$M.pte.xz > /tmp/m/$M.pte
rm -rf /tmp/site/pte_wgpu /tmp/t_new; mkdir -p /tmp/t_new; cp -r async_runtime kernels resize examples /tmp/t_new/
prof() {  # tree, name, args...
  local t=$1 name=$2; shift 2
  [ -d /tmp/t_$t ] || { mkdir -p /tmp/t_$t; xz -dc $TREES_DIR/tree_$t.tar.xz | tar -x -C /tmp/t_$t; }
  mkdir -p /tmp/t_$t/pte_wgpu; ln -sfn /tmp/t_$t/kernels /tmp/t_$t/pte_wgpu/kernels; ln -sfn /tmp/t_$t/resize /tmp/t_$t/pte_wgpu/resize
  (cd /tmp/t_$t && PTE_WGPU_BACKEND=dawn PYTHONPATH=/tmp/t_$t:/tmp/site timeout 100 python3 examples/profile_ragged_decode.py /tmp/m/$M.pte "$@" --batch-variant > $OUT/${name}_$t.log 2>&1)
  echo "== $t $name rc=$? $(( $(date +%s) - t0 )) s"
}
for t in ${TREES:-head new t64 nostore noload t2x4 t256}; do
  [ $(( $(date +%s) - t0 )) -gt ${BD_UNTIL:-330} ] && break
  prof $t bd 16 --by-dispatch
  grep "^==" $OUT/bd_$t.log; awk '/subgroup matrices/ {s[$2]+=$3; n[$2]++} /linear_q4gsw/ {print "   head", $3} END {for (k in s) printf "   %-36s %3d tiles %8.1f us\n", k, n[k], s[k]}' $OUT/bd_$t.log
done
for t in head new; do prof $t ws 1,16 --whole-steps; grep "^==" $OUT/ws_$t.log || tail -3 $OUT/ws_$t.log; done
if [ "${TESTS:-1}" = 1 ]; then
  left=$(( ${END:-470} - $(date +%s) + t0 ))
  mkdir -p .st /tmp/ao && tar -xJf $STORE_XZ -C .st && tar -xJf $AO -C /tmp/ao
  mkdir -p /tmp/site/pte_wgpu; ln -sfn $PWD/kernels /tmp/site/pte_wgpu/kernels; ln -sfn $PWD/resize /tmp/site/pte_wgpu/resize
  PTE_WGPU_BACKEND=dawn PTE_WGPU_REQUIRE_ADAPTER=1 PTE_WGPU_EXPORT_DIR=$PWD/.st PYTHONPATH=$PYTHONPATH:/tmp/ao timeout $left python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/test_int8_matrix.py tests/test_fp16_linear.py -k "asyncio and (int8_matrix or matrices or match_eager) and not cpu" > $OUT/tests.log 2>&1
  echo "== tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $OUT/tests.log | tail -12
fi
echo "== all $(( $(date +%s) - t0 )) s"
