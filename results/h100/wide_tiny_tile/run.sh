#!/usr/bin/env bash
# Decode A/B on the GPU machine, from the checkout root: old = the tree in $TREES_DIR/tree_head.tar.xz (git archive of
# the code before), new = this checkout; Llama-3.2-1B 4w of f16 activations loaded with batch_invariant=False, Dawn,
# rounds in ORDER. WHEELS, KIT and AO as results/h100/q4_f16_matrix_decode_rows/run.sh takes them.
set -u
WHEELS=$WHEELS KIT=$KIT STORE=.st AO=$AO OLD_TREE=$TREES_DIR/tree_head.tar.xz PEER=${PEER:-0} TESTS=0 RUNS=1 SESSIONS=${SESSIONS:-1,16,32} \
  BENCH_ARGS=--batch-variant ORDER="${ORDER:-old@dawn new@dawn new@dawn old@dawn}" SECS=70 bash results/h100/q4_f16_matrix_decode_rows/run.sh 2>&1 | tail -14
