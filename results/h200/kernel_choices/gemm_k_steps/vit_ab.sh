#!/usr/bin/env bash
# ViT-B/16 before and after the GEMM's K steps of 8 and loads 4 of K at a time (.gk/before, .gk/after: the two
# versions' wheels; .gk/vit.tar.xz): results/h200/vit_ab.sh.
exec bash results/h200/vit_ab.sh .gk
