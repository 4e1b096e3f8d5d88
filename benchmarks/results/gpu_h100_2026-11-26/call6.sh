python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
(nvidia-smi --query-gpu=name,memory.total --format=csv; git log --oneline -1 2>/dev/null; date -u) | tee $OUT/env.log
timeout 110 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py tests/triton_kernels/test_gpu_fused_layers.py \
  tests/triton_kernels/test_filtered_sampling.py tests/test_selection.py -q -p no:cacheprovider 2>&1 | grep -v Warn | tee $OUT/pytest_gpu.log
for r in 1 2; do
  echo "== base (HEAD 9b24b3c) round $r"; (cd gpu_run/base && timeout 40 python3 benchmarks/select_speed.py --rows 1 8 64 256)
  echo "== top-k floor round $r"; timeout 40 python3 benchmarks/select_speed.py --rows 1 8 64 256
done 2>&1 | tee $OUT/select_ab.log
timeout 100 python3 benchmarks/kernels.py --full --partition 512 1024 2048 --block-n 16 32 --dots 16 --grid head \
  --num-warps 4 8 --num-stages 3 4 2>&1 | tee $OUT/kernels.log
python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from benchmarks.decode import build_model; build_model(32, Path('/tmp/l3'))" 2>&1 | tail -1
timeout 200 python3 benchmarks/decode.py --skip-hf --batch-sizes 1 64 256 --gen-len 128 --model-dir /tmp/l3 2>&1 \
  | grep -v "Warn\|warn_once\|Loading" | tee $OUT/decode.log
