#!/usr/bin/env bash
# The GPU figures the CPU-only sessions owe, in one device call (about 7 minutes on an H200):
#   run(command="bash scripts/gpu_owed.sh", carry=[".whl"], timeout_s=560)
# `.whl` holds the cp312 wheels the device lacks (outlines_core; see the device tool's README).
# Logs go to $OUT (or ./gpu_out).
set -o pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
(nvidia-smi --query-gpu=name,memory.total --format=csv; git log --oneline -1; git status --short) | tee "$OUT/env.log"
timeout 150 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py tests/triton_kernels/test_gpu_fused_layers.py \
  tests/triton_kernels/test_filtered_sampling.py tests/test_selection.py -q -p no:cacheprovider 2>&1 \
  | grep -v Warn | tee "$OUT/pytest_gpu.log"
timeout 60 python3 benchmarks/select_speed.py 2>&1 | tee "$OUT/select_bench.log"
timeout 60 python3 benchmarks/kernels.py --full --partition 1024 --block-n 32 64 --dots 16 --grid head seq \
  --num-warps 4 --num-stages 3 2>&1 | tee "$OUT/kernels.log"
python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from benchmarks.decode import build_model; build_model(32, Path('/tmp/l3'))" 2>&1 | tail -1
timeout 240 python3 benchmarks/decode.py --skip-hf --batch-sizes 1 64 256 --gen-len 64 --model-dir /tmp/l3 2>&1 \
  | grep -v "Warn\|warn_once\|Loading" | tee "$OUT/decode.log"
