#!/usr/bin/env bash
# The GPU figures the sessions without a GPU owe, in one device call (about 4-5 minutes on an
# H100, 2026-11-26):
#   run(command="bash scripts/gpu_owed.sh", carry=[".whl"], timeout_s=420)
# `.whl` holds the cp312 wheels the device lacks (outlines_core; see the device tool's README).
# Logs go to $OUT (or ./gpu_out). spec.py has a sixth engine since 2026-11-26 late (n-gram without
# the recent outputs; every cell its own prompts). Owed after 2026-11-26's session: the GPU tests at its end
# (the draft's tail graphs without the lm_head, bc0a591), spec.py over 2 repeats with verify and
# tail graphs and adaptive speculation's drafted share (10da319), decode.py after them, and
# where the GPU idles between decode steps at batch 1 (5.8-7.4% in the last runs, short of issue
# 17's 165 tok/s): decode.py --trace-dir writes the traces and prints benchmarks/step_gaps.py's
# reading of each (the gaps by the host phase that launched late).
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
  | grep -v Warn | tail -20 | tee "$OUT/pytest_gpu.log"
timeout 150 python3 benchmarks/spec.py --batch-sizes 1 4 16 64 --repeats 2 --result-json "$OUT/spec_gpu.json" 2>&1 \
  | grep -v "Warn\|warn_once" | tee "$OUT/spec_gpu.log"
timeout 40 python3 benchmarks/kernels.py --full --partition 512 1024 --block-n 32 64 --dots 16 --grid head \
  --num-warps 4 --num-stages 3 2>&1 | grep -v Warn | tee "$OUT/kernels.log"
# Batch-1 decode attention: one split of 1,024 is 8 programs on 132 SMs (~11 us a layer); do
# shorter partitions (more splits per short sequence, then a merge) read faster? (note16)
timeout 40 python3 benchmarks/kernels.py --full --batch 1 --context 512 --partition 64 128 256 1024 \
  --block-n 32 --dots 16 --grid head --num-warps 4 --num-stages 3 2>&1 | grep -v Warn | tee "$OUT/kernels_b1.log"
timeout 240 python3 benchmarks/decode.py --skip-hf --max-model-len 8192 --batch-sizes 1 64 256 --gen-len 128 \
  --model-dir /tmp/l3 --trace-dir "$OUT/traces" 2>&1 | grep -v "Warn\|warn_once\|Loading" | tee "$OUT/decode.log"
