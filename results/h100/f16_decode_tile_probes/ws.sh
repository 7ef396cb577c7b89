#!/usr/bin/env bash
# whole-step GPU times per tree at ROWS for model M (default fp16)
set -u
export M=${M:-llama3_2_1b_synthetic_fp16_ctx2048}
TREES="${TREES:-base}" ROWS=${ROWS:-16} bash results/h100/float_subgroup_norm_fold/probe.sh 2>&1 | grep -v WARN | grep -E "GPU time|rror|^== all" 
