#!/bin/bash
# Served / engine alone at concurrency 8 and 32: per-step streaming (the shipped config) against
# stream_interval_ms 20, alternated; HAProxy in both.
cd /work/main
P=benchmarks/out/s13/si_ab; mkdir -p $P
run() { # label config round
  (HF_HUB_OFFLINE=1 setsid nohup /work/venv/bin/serve run $2 > $P/serve_$1_$3.log 2>&1 &)
  for i in $(seq 90); do curl -sf localhost:8000/v1/models >/dev/null && break; sleep 2; done
  /work/venv/bin/python benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 48 --concurrency 8 32 --input-len 128 --output-len 64 --dataset grounded --compare-engine checkpoints/tiny-target --engine-torch-threads 1 --engine-arg speculative_method=ngram --engine-arg prompt_lookup_min=3 --engine-arg kv_cache_memory_gib=0.5 --engine-arg max_num_batched_tokens=1024 --rounds 2 --disable-tqdm > $P/$1_$3.log 2>&1
  echo "$1 round $3 (HTTP / engine alone, e2e mean at 8, 32): $(grep -A3 'Serve overhead' $P/$1_$3.log | tail -2 | awk '{print $3}' | tr '\n' ' ')"
  pkill -TERM -f "serve run"; sleep 12
}
run per_step serve_config.yaml 1
run every_20ms benchmarks/out/s13/si20.yaml 1
run every_20ms benchmarks/out/s13/si20.yaml 2
run per_step serve_config.yaml 2
