#!/bin/bash
# Ingress at Ray's niceness (15) against niceness 0, HAProxy in both; alternated.
cd /work/main
P=benchmarks/out/s13/nice_ab; mkdir -p $P
run() { # label config
  (HF_HUB_OFFLINE=1 setsid nohup /work/venv/bin/serve run $2 > $P/serve_$1_$3.log 2>&1 &)
  for i in $(seq 90); do curl -sf localhost:8000/v1/models >/dev/null && break; sleep 2; done
  /work/venv/bin/python benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 48 --concurrency 1 8 32 --input-len 128 --output-len 64 --dataset grounded --disable-tqdm --result-json $P/$1_$3.json > $P/$1_$3.log 2>&1
  echo "$1 round $3: $(grep 'Mean E2EL' $P/$1_$3.log | awk '{print $4}' | tr '\n' ' ')"
  pkill -TERM -f "serve run"; sleep 12
}
run nice15 serve_config.yaml 1
run nice0 benchmarks/out/s13/ingress_nice0.yaml 1
run nice0 benchmarks/out/s13/ingress_nice0.yaml 2
run nice15 serve_config.yaml 2
run nice15 serve_config.yaml 3
run nice0 benchmarks/out/s13/ingress_nice0.yaml 3
