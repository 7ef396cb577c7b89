#!/usr/bin/env bash
# ar.load's phases of the Llama-3.2-1B shape 4w (.pk/*.pte.xz), the load's warm-up on a throwaway
# session of the ragged graph (.ab1b/before, bc05d73) against on the ragged runner (.ab1b/after), each
# three loads in a process (the first into a cold pipeline cache), twice, alternating
# (results/h200/upload_paths/load_phases.py).
source results/h200/ab_setup.sh .ab1b
p=/tmp/1b.pte
[ -f $p ] || xz -T16 -dc .pk/*.pte.xz > $p
for round in 1 2; do
  for v in before after; do
    echo "== $v round $round"
    PYTHONPATH=/tmp/w_$v timeout 120 python3 results/h200/upload_paths/load_phases.py $p 3 2>&1 | grep -v Warn
  done
done
