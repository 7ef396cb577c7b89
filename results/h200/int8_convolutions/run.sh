#!/usr/bin/env bash
# The int8 convolutions' routes on an H200 (routes.py), wgpu-native then Dawn, with torch eager fp32
# on the float modules. Run from the checkout root with the Vulkan loader's debs unpacked and the
# wheels of wgpu-py (and its dependencies), wgpudawn and this project on PYTHONPATH (README.txt);
# $MODELS holds examples/bench_vision.py's `export --int8` folder (MobileNet V2 and ResNet-50 at
# 224 px, batch 1) and tests/test_int8_conv.py's q8_tiled_convs export; $FP32 the float exports
# of the same models at batch 1 (`export`), for our fp32 beside our int8.
set -u
HERE=results/h200/int8_convolutions
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -n "${FP32:-}" ] && timeout 200 python3 examples/bench_vision.py run $FP32 --runs ${RUNS:-20} 2>&1 | grep -v Warn | tail -4
for backend in wgpu-native dawn; do
  for M in mobilenet_v2_int8_b1 resnet50_int8_b1; do
    PTE_WGPU_BACKEND=$backend timeout 200 python3 $HERE/routes.py $MODELS/$M.pte --runs ${RUNS:-20} --torch $MODELS 2>&1 | grep -v Warn
  done
  PTE_WGPU_BACKEND=$backend timeout 100 python3 $HERE/routes.py $MODELS/q8_tiled_convs.pte --runs 5 --shape 2,3,23,29 2>&1 | grep -v Warn
done
