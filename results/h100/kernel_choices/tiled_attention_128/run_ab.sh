#!/usr/bin/env bash
# 8B shape (4 layers) 4w: prefill A/B of two wheels (.b8/v/old, .b8/v/new), two rounds; then the new
# wheel's whole bench against llama.cpp and a prefill profile.
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl1b/*.whl | grep -v pte_wgpu) 2>&1 | tail -1
for v in old new; do python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_$v .b8/v/$v/*.whl 2>&1 | tail -1; done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/m8 /tmp/lc
M=/tmp/m8/llama3_1_8b_synthetic_4layers_4w_ctx2048.pte
[ -f $M ] || cat /tmp/parts/part_* | xz -T16 -dc > $M
G=/tmp/m8/llama8b4-q4_0.gguf
[ -f $G ] || xz -T16 -dc .b8/run/llama8b4-q4_0.gguf.xz > $G
[ -x /tmp/lc/llamacpp-bin/llama-bench ] || xz -dc .peers/llamacpp/bin/llamacpp-bin.tar.xz | tar -x -C /tmp/lc
ls -la $M
for round in 1 2; do for v in old new; do
  PYTHONPATH=/tmp/site_$v:/tmp/site timeout 120 python3 .b8/run/prefill_ab.py $M "$v round $round" 2>&1 | grep -v Warn | tail -2
done; done
[ -n "${FULL:-}" ] || exit 0
export PYTHONPATH=/tmp/site_new:/tmp/site
PYTHONPATH=/tmp/site_new:/tmp/site timeout 120 python3 examples/profile_prefill.py $M 512,2047 2>&1 | grep -v Warn | tail -32
