#!/bin/bash
# Per-process CPU during 192 requests at concurrency 32: the controller loop at Ray's 0.1 s
# (serve_loop01.yaml: serve_config.yaml without RAY_SERVE_CONTROL_LOOP_INTERVAL_S) against
# the shipped 0.5 s, alternated, twice each.
cd /work/main
for cfg in benchmarks/out/s14/serve_loop01.yaml serve_config.yaml benchmarks/out/s14/serve_loop01.yaml serve_config.yaml; do
  echo "=== $cfg $(date +%H:%M:%S)"
  (HF_HUB_OFFLINE=1 setsid nohup /work/venv/bin/serve run $cfg > /tmp/s14_serve_ab.log 2>&1 &)
  for i in $(seq 1 90); do sleep 2; curl -sf localhost:8000/v1/models >/dev/null && break; done
  sleep 10
  benchmarks/out/s14/c32_cpu.sh 2>&1 | head -12
  pkill -TERM -f "serve run"; sleep 6; pkill -9 -f "ray::"; sleep 2
done
