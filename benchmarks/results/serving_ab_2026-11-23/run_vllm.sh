#!/usr/bin/env bash
set -u
. /work/venv/bin/activate
cd /work/main
for round in 1 2; do
  for side in vllm new; do
    ray stop --force >/dev/null 2>&1
    if [ $side = vllm ]; then
      (cd /work/main && ~/vllm-venv/bin/python -m vllm.entrypoints.openai.api_server --model checkpoints/tiny-target --served-model-name tiny-target --dtype float32 --port 8000 --gpu-memory-utilization 0.5 > /tmp/servab/serve_vllm_${round}.log 2>&1 &)
    else
      (cd /work/main && HF_HUB_OFFLINE=1 serve run serve_config.yaml > /tmp/servab/serve_newv_${round}.log 2>&1 &)
    fi
    for i in $(seq 1 150); do curl -sf http://127.0.0.1:8000/v1/models >/dev/null && break; sleep 2; done
    python /work/main/benchmarks/serving.py --model checkpoints/tiny-target --served-model-name tiny-target --num-prompts 48 --concurrency 1 8 32 --input-len 128 --output-len 64 --disable-tqdm --result-json /tmp/servab/v_${side}_${round}.json > /tmp/servab/v_${side}_${round}.txt 2>&1
    echo "round $round $side done $(date +%T)"
    pkill -f "serve run serve_config.yaml"; pkill -f "vllm.entrypoints.openai.api_server"; sleep 5; ray stop --force >/dev/null 2>&1
  done
done
