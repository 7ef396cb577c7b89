#!/usr/bin/env bash
# MobileNet V2 and ResNet-50 at batch 1 and 8 ($1/cnn.tar.xz: examples/bench_vision.py export --models
# mobilenet_v2,resnet50, tiled weights) before and after a change, as vit_ab.sh runs ViT-B/16; with
# PROFILE=1 one profiled run of ResNet-50 under each.
ARCHIVE=cnn.tar.xz MODELS=mobilenet_v2,resnet50 PROFILED=resnet50 exec bash results/h200/vit_ab.sh $1
