#!/bin/bash
# Served, grounded: n-gram from 3-token matches (shipped) vs from 1-token matches vs speculation off; greedy, then sampled.
cd /work/main
HF_HUB_OFFLINE=1 /work/venv/bin/python benchmarks/serving_compare.py --servers specserve specserve:prompt_lookup_min=1 \
  specserve:speculative_method=null --baseline specserve:speculative_method=null --dataset grounded --concurrency 1 8 --rounds 3
