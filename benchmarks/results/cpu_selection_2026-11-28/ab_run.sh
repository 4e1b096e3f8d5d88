#!/bin/bash
# usage: ab_run.sh ROUNDS TEMPERATURE BASE_TREE WORK_TREE
for r in $(seq 1 $1); do
  for side in "$3" "$4"; do
    echo "$r $side $(python "$(dirname "$0")/b1_probe.py" $side $2 2>/dev/null | tail -1)"
  done
done
