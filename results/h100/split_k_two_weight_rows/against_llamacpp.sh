#!/usr/bin/env bash
# decode A/B with llama.cpp, old = tree_head, new = checkout, batch-variant, Dawn: the 1B 4w, then the 8B shape (4 layers)
# WHEELS, KIT, AO, OLD_TREE as results/h100/q4_f16_matrix_decode_rows/run.sh takes them (KIT holding both exports and GGUFs)
set -u
for mg in ${MODELS:-llama3_2_1b_synthetic_4w_fp16_ctx2048:llama1b-q4_0 llama3_1_8b_synthetic_4layers_4w_fp16_ctx2048:llama8b4-q4_0}; do
  echo "#### $mg"
  M=${mg%%:*} G=${mg#*:} WHEELS=$WHEELS KIT=$KIT STORE=.st AO=$AO OLD_TREE=$OLD_TREE PEER=${PEER:-1} TESTS=0 RUNS=1 SESSIONS=${SESSIONS:-1,16,32,64} \
    BENCH_ARGS="${BENCH_ARGS---batch-variant}" ORDER="${ORDER:-old@dawn new@dawn new@dawn old@dawn}" SECS=90 bash results/h100/q4_f16_matrix_decode_rows/run.sh 2>&1 | grep -v WARN | tail -12
  (M=${mg%%:*}; cd $OUT && tar -czf /tmp/$M.tgz --exclude="*.tgz" . && find . -maxdepth 1 -type f ! -name "*.tgz" -delete && mv /tmp/$M.tgz .)
done
