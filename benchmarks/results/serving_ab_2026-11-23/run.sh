#!/usr/bin/env bash
# A/B of the served app: HEAD work tree vs the session's start (3032483), alternated, 2 rounds.
set -u
. /work/venv/bin/activate
cd /work/main
rm -rf /tmp/servab/old; git worktree add --detach -q /tmp/servab/old 3032483
for round in 1 2; do
  for side in new old; do
    [ $side = new ] && dir=/work/main || dir=/tmp/servab/old
    ray stop --force >/dev/null 2>&1
    (cd $dir && PYTHONPATH=$dir HF_HUB_OFFLINE=1 serve run serve_config.yaml > /tmp/servab/serve_${side}_${round}.log 2>&1 &)
    for i in $(seq 1 120); do curl -sf http://127.0.0.1:8000/v1/models >/dev/null && break; sleep 2; done
    python /work/main/benchmarks/serving.py --model checkpoints/tiny-target --served-model-name tiny-target --num-prompts 48 --concurrency 1 8 32 --input-len 128 --output-len 64 --disable-tqdm --result-json /tmp/servab/${side}_${round}.json > /tmp/servab/${side}_${round}.txt 2>&1
    echo "round $round $side done $(date +%T)"
    pkill -f "serve run serve_config.yaml"; sleep 3; ray stop --force >/dev/null 2>&1
  done
done
git worktree remove --force /tmp/servab/old
