# Issue 18's served figures at a32c7ce, from a worktree so the live tree can change meanwhile.
source /work/venv/bin/activate
export HF_HUB_OFFLINE=1
cd <a worktree of a32c7ce>
L=<this folder>
date -u; git log --oneline -1
# 1. served (serve_config.yaml: ngram, 3-token matches) against the engine alone with the same speculation
serve run serve_config.yaml > $L/serve_run.log 2>&1 &
SERVE=$!
for i in $(seq 1 120); do curl -sf localhost:8000/v1/models >/dev/null && break; sleep 2; done
python benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 48 --concurrency 1 8 32 \
  --input-len 128 --output-len 64 --dataset grounded --compare-engine checkpoints/tiny-target \
  --engine-torch-threads 1 --engine-arg speculative_method=ngram --engine-arg prompt_lookup_min=3 \
  --engine-arg kv_cache_memory_gib=0.5 --engine-arg max_num_batched_tokens=1024 \
  --rounds 3 --disable-tqdm > $L/served_vs_engine_alone.log 2>&1
# (the run sent -INT, which a background job ignores; I sent TERM by hand)
kill -TERM $SERVE; wait $SERVE; sleep 5; ray stop --force >/dev/null 2>&1; pkill -f "ray::" ; sleep 3
date -u
# 2. speculation on (shipped) against off, copying prompts, concurrency 1, greedy
python benchmarks/serving_compare.py --servers specserve specserve:speculative_method=null \
  --baseline specserve:speculative_method=null --dataset grounded --concurrency 1 --rounds 3 > $L/grounded_c1.log 2>&1
date -u
# 3. the same, sampled
python benchmarks/serving_compare.py --servers specserve specserve:speculative_method=null \
  --baseline specserve:speculative_method=null --dataset grounded --concurrency 1 --rounds 3 \
  --temperature 0.8 --top-p 0.95 > $L/grounded_sampled_c1.log 2>&1
date -u
