#!/usr/bin/env bash
# profile decode passes per op (and whole steps) under each tree of TREES (names in TREES_DIR, "new" = checkout)
set -u
t0=$(date +%s)
. results/h200/suite_on_both_backends/prelude.sh
M=${M:-llama3_2_1b_synthetic_4w_fp16_ctx2048}
mkdir -p /tmp/m; [ -f /tmp/m/$M.pte ] || xz -T16 -dc $KIT/$M.pte.xz > /tmp/m/$M.pte
rm -rf /tmp/site/pte_wgpu /tmp/t_new; mkdir -p /tmp/t_new; cp -r async_runtime kernels resize examples /tmp/t_new/
for t in ${TREES:-new}; do
  [ $t = new ] || { rm -rf /tmp/t_$t; mkdir -p /tmp/t_$t; xz -dc $TREES_DIR/tree_$t.tar.xz | tar -x -C /tmp/t_$t; }
  mkdir -p /tmp/t_$t/pte_wgpu; ln -sfn /tmp/t_$t/kernels /tmp/t_$t/pte_wgpu/kernels; ln -sfn /tmp/t_$t/resize /tmp/t_$t/pte_wgpu/resize
  cd /tmp/t_$t
  for mode in ${MODES:---whole-steps x}; do
    [ "$mode" = x ] && mode=""
    PTE_WGPU_BACKEND=dawn PYTHONPATH=/tmp/t_$t:/tmp/site timeout 200 python3 examples/profile_ragged_decode.py /tmp/m/$M.pte ${ROWS:-1,8,16} $mode > $OUT/prof_${t}${mode//-/_}.log 2>&1
    echo "== $t $mode rc=$? $(( $(date +%s) - t0 )) s"; grep -v "^\s*$" $OUT/prof_${t}${mode//-/_}.log | tail -${LINES_:-45}
  done
  cd - > /dev/null
done
