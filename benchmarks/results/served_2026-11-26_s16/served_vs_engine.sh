#!/bin/bash
# The issue-18 command: served (serve run serve_config.yaml) against the engine alone, 3 rounds.
cd /work/main
(HF_HUB_OFFLINE=1 setsid nohup /work/venv/bin/serve run serve_config.yaml > benchmarks/out/s16/serve_issue.log 2>&1 &)
for i in $(seq 1 90); do sleep 2; curl -sf localhost:8000/v1/models >/dev/null && break; done
sleep 5
HF_HUB_OFFLINE=1 /work/venv/bin/python benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 48 \
  --concurrency 1 8 32 --input-len 128 --output-len 64 --dataset grounded --compare-engine checkpoints/tiny-target \
  --engine-torch-threads 1 --engine-arg speculative_method=ngram --engine-arg prompt_lookup_min=3 \
  --engine-arg kv_cache_memory_gib=0.5 --engine-arg max_num_batched_tokens=1024 --rounds 3
pkill -TERM -f "serve run"; sleep 6; pkill -9 -f "ray::"
sleep 3
HF_HUB_OFFLINE=1 /work/venv/bin/python benchmarks/serving_compare.py --servers specserve specserve:speculative_method=null \
  --baseline specserve:speculative_method=null --dataset grounded --concurrency 1 8 32 --rounds 3
