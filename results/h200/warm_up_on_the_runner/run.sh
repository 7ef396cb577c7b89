#!/usr/bin/env bash
# ar.load's phases of the Llama-3.2-1B shape 4w (.pk/*.pte.xz), the load's warm-up on a throwaway
# session of the ragged graph (.ab1b/before, bc05d73) against on the ragged runner (.ab1b/after), each
# three loads in a process (the first into a cold pipeline cache), twice, alternating
# (results/h200/upload_paths/load_phases.py).
set -u
for f in .gl/*.deb; do dpkg -x $f / ; done; ldconfig
for v in before after; do
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/w_$v .whl1b/*.whl .ab1b/$v/*.whl 2>&1 | tail -1
done
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp
p=/tmp/1b.pte
[ -f $p ] || xz -T16 -dc .pk/*.pte.xz > $p
for round in 1 2; do
  for v in before after; do
    echo "== $v round $round"
    PYTHONPATH=/tmp/w_$v timeout 120 python3 results/h200/upload_paths/load_phases.py $p 3 2>&1 | grep -v Warn
  done
done
