#!/usr/bin/env bash
# one call: the fp16 fused linears' GPU tests, whole-step GPU times base/new, bench rounds ORDER, llama.cpp F16 (G) before and after
set -u
t0=$(date +%s)
bash $(dirname $0)/gputests.sh 2>&1 | grep -v WARN
export M=llama3_2_1b_synthetic_fp16_ctx2048 G=${G:-llama1b-f16}
mkdir -p /tmp/m /tmp/lc
[ -f /tmp/m/$G.gguf ] || xz -dc .bm/$G.gguf.xz > /tmp/m/$G.gguf
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc .bm/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
. $(dirname $0)/peer.sh
NPL=${NPL:-1,16} peer 1
echo "== peer $(( $(date +%s) - t0 )) s"
TREES="base new base new" ROWS=1,16 bash $(dirname $0)/probe.sh 2>&1 | grep -v WARN | grep -E "GPU time|rror" | grep -v "^=="
VARIANT=" " TREES="new base" ROWS=1,16 bash $(dirname $0)/probe.sh 2>&1 | grep -v WARN | grep -E "GPU time|rror" | grep -v "^==" | sed 's/^/invariant /'
echo "== ws $(( $(date +%s) - t0 )) s"
TREES= ORDER="${ORDER:-base new new base}" SESSIONS=${SESSIONS:-1,16} bash $(dirname $0)/probe.sh 2>&1 | grep -v WARN | grep -E "^(base|new) |rror"
NPL=${NPL:-1,16} peer 2
echo "== all $(( $(date +%s) - t0 )) s"
