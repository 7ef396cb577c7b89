#!/usr/bin/env bash
# ViT-B/16 before and after its attention runs as one pte_wgpu.attention (.pf/before, .pf/after: the two
# versions' wheels; .pf/vit.tar.xz), then one profiled run of each: results/h200/vit_ab.sh.
PROFILE=1 exec bash results/h200/vit_ab.sh .pf
