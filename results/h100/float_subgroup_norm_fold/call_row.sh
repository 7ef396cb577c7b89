#!/usr/bin/env bash
# one export's decode row against llama.cpp: peer, ours ORDER rounds (trees .ab/tree_NAME.tar.xz), peer again
set -u
. results/h200/suite_on_both_backends/prelude.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/m /tmp/lc
[ -f /tmp/m/$G.gguf ] || xz -dc .bm/$G.gguf.xz > /tmp/m/$G.gguf
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc .bm/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
. $(dirname $0)/peer.sh
peer 1
TREES= ORDER="$ORDER" SESSIONS=${SESSIONS:-1,16,32,64} bash $(dirname $0)/probe.sh 2>&1 | grep -v WARN | grep -E "^(base|new) |rror"
peer 2
