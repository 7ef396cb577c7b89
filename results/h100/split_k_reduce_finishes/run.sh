#!/usr/bin/env bash
# decode A/B: old = HEAD before the SwiGLU reduce (tree_head), new = checkout; 1B 4w of f16 activations, batch-variant, Dawn
set -u
mkdir -p .st && tar -xJf $STORE_XZ -C .st
WHEELS=$WHEELS KIT=$KIT STORE=.st AO=$AO OLD_TREE=$TREES_DIR/tree_head.tar.xz PEER=${PEER:-0} TESTS=0 RUNS=1 SESSIONS=${SESSIONS:-1,16,32} \
  BENCH_ARGS=--batch-variant ORDER="${ORDER:-old@dawn new@dawn new@dawn old@dawn}" SECS=70 bash results/h100/q4_f16_matrix_decode_rows/run.sh 2>&1 | tail -14
