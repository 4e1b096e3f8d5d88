cd /work/main
HF_HUB_OFFLINE=1 /work/venv/bin/python benchmarks/serving_compare.py --servers specserve \
  'specserve:serve.controller_options.runtime_env.env_vars.RAY_worker_niceness="0",serve.applications.0.deployments.0.ray_actor_options.runtime_env.env_vars.RAY_worker_niceness="15"' \
  --baseline specserve --dataset grounded --concurrency 8 32 --rounds 3 --num-prompts 96
