python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
timeout 80 python3 benchmarks/kernels.py --full --batch 256 --context 192 --partition 1024 --block-n 16 32 64 --dots 16 --grid head seq \
  --num-warps 2 4 8 --num-stages 3 2>&1 | tee $OUT/kernels_b256_c192.log
timeout 150 python3 gpu_run/profile_step.py /tmp/l3 2>&1 | grep -v "Warn\|warn_once\|Loading" | tee $OUT/profile_step.log
