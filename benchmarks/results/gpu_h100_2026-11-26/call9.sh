python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
(nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date -u) | tee $OUT/env.log
timeout 200 python3 benchmarks/spec.py --batch-sizes 1 4 16 64 --repeats 2 --result-json $OUT/spec_gpu.json 2>&1 \
  | grep -v "Warn\|warn_once" | tee $OUT/spec_gpu.log
