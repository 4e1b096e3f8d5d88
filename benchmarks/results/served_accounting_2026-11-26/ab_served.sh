source /work/venv/bin/activate
export HF_HUB_OFFLINE=1
cd /work/main
L=benchmarks/out/s12
date -u
python benchmarks/compare_refs.py c9748c3 --serving --no-offline --dataset grounded --concurrency 1 --rounds 3 \
  --temperature 0.8 --top-p 0.95 > $L/ab_served_sampled_c1.log 2>&1
date -u
python benchmarks/compare_refs.py c9748c3 --serving --no-offline --dataset grounded --concurrency 1 --rounds 3 \
  > $L/ab_served_greedy_c1.log 2>&1
date -u
python benchmarks/compare_refs.py a32c7ce --rounds 3 > $L/ab_offline_runner.log 2>&1
date -u
