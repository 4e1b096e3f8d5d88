# Session 15, call 3: CUDA graphs for verifying steps. GPU tests (test_gpu.py: the verify-graph
# replay against eager, speculation through the graphs against the plain engine), then per-step
# times and spec.py (16 prompts per cell) with the graphs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
(nvidia-smi --query-gpu=name --format=csv,noheader; date -u) | tee $OUT/env.log
timeout 100 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py -q -p no:cacheprovider -x 2>&1 | grep -v Warn | tail -25 | tee $OUT/pytest_gpu.log
date -u +%T | tee -a $OUT/env.log
timeout 60 python3 gpu_run/spec_steps.py 2>&1 | grep -v "Warn\|warn_once" | tee $OUT/spec_steps.log
date -u +%T | tee -a $OUT/env.log
timeout 110 python3 benchmarks/spec.py --batch-sizes 1 4 16 64 --repeats 2 --result-json $OUT/spec_gpu.json 2>&1 \
  | grep -v "Warn\|warn_once" | tee $OUT/spec_gpu.log
date -u +%T | tee -a $OUT/env.log
