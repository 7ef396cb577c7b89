#!/usr/bin/env bash
# ar.load's phases of the Llama-3.1-8B shape with 4 of its 32 layers, 4w (2,589 MB; xz-packed in two parts:
# the first copied to /tmp/parts by the call before, .p8/part_ab here), the code at bc05d73 (.ab1b/before:
# the staged uploads, the warm-up on a throwaway session) and this code (.ab1b/after), each three loads a process
# (the first into a cold pipeline cache), twice, alternating (results/h200/upload_paths/load_phases.py);
# then the host-to-device copy rate of 2 GiB through the staging ring (results/h200/upload_paths/uploads.py).
source results/h200/ab_setup.sh .ab1b
p=/tmp/8b.pte
[ -f $p ] || cat /tmp/parts/part_aa .p8/part_ab | xz -T16 -dc > $p
ls -la $p
for round in 1 2; do
  for v in before after; do
    echo "== $v round $round"
    PYTHONPATH=/tmp/w_$v timeout 150 python3 results/h200/upload_paths/load_phases.py $p 3 2>&1 | grep -v Warn
  done
done
PYTHONPATH=/tmp/w_after timeout 100 python3 results/h200/upload_paths/uploads.py 64 32 2>&1 | grep -v Warn
