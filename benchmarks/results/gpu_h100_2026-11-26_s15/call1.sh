# Session 15, call 1: the owed GPU figures at the session's head (b40b487 + capture timing):
# pytest -m gpu over the four GPU test files; decode attention 64 x 4096 (kernels.py); decode.py
# at max_model_len 8192 in full, with the graph-capture start-up time; spec.py with 16 prompts
# per cell (issue 18's GPU figure).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
(nvidia-smi --query-gpu=name --format=csv,noheader; date -u) | tee $OUT/env.log
timeout 130 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py tests/triton_kernels/test_gpu_fused_layers.py \
  tests/triton_kernels/test_filtered_sampling.py tests/test_selection.py -q -p no:cacheprovider 2>&1 | grep -v Warn | tail -15 | tee $OUT/pytest_gpu.log
date -u +%T | tee -a $OUT/env.log
timeout 50 python3 benchmarks/kernels.py --full --partition 512 1024 --block-n 32 64 --dots 16 --grid head \
  --num-warps 4 --num-stages 3 2>&1 | grep -v Warn | tee $OUT/kernels.log
date -u +%T | tee -a $OUT/env.log
timeout 240 python3 benchmarks/decode.py --skip-hf --max-model-len 8192 --batch-sizes 1 64 256 --gen-len 128 \
  --model-dir /tmp/l3 2>&1 | grep -v "Warn\|warn_once\|Loading" | tee $OUT/decode.log
date -u +%T | tee -a $OUT/env.log
timeout 110 python3 benchmarks/spec.py --batch-sizes 1 4 16 64 --repeats 2 --result-json $OUT/spec_gpu.json 2>&1 \
  | grep -v "Warn\|warn_once" | tee $OUT/spec_gpu.log
date -u +%T | tee -a $OUT/env.log
