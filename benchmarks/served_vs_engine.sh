#!/usr/bin/env bash
# Issue 18's served measure, as the sessions run it (about 12 minutes on 2 CPU cores):
# `serve run serve_config.yaml`, then the grounded workload at concurrency 1, 8 and 32 against
# the engine alone drafting in-process by n-gram from 3 tokens (3 rounds); then the served app
# with speculation on against off, each side started fresh per round (3 rounds alternated).
#   bash benchmarks/served_vs_engine.sh [LOG_DIR]      # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-benchmarks/out/served_vs_engine}; mkdir -p "$LOG"
PY=${PYTHON:-python}
export HF_HUB_OFFLINE=1
(setsid nohup serve run serve_config.yaml > "$LOG/serve.log" 2>&1 &)
for _ in $(seq 1 90); do sleep 2; curl -sf localhost:8000/v1/models > /dev/null && break; done
sleep 5
"$PY" benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 48 --concurrency 1 8 32 \
  --input-len 128 --output-len 64 --dataset grounded --compare-engine checkpoints/tiny-target \
  --engine-torch-threads 1 --engine-arg speculative_method=ngram --engine-arg prompt_lookup_min=3 \
  --engine-arg kv_cache_memory_gib=0.5 --engine-arg max_num_batched_tokens=1024 --rounds 3
pkill -TERM -f "serve run" || true; sleep 6; pkill -9 -f "ray::" || true; sleep 3
"$PY" benchmarks/serving_compare.py --servers specserve specserve:lookup_recent_output_tokens=0 \
  specserve:speculative_method=null \
  --baseline specserve:speculative_method=null --dataset grounded --concurrency 1 8 32 --rounds 3
