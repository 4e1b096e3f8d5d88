# Session 15, call 5 (the budget's last 4 minutes): the draft model's uncached tails as CUDA
# graphs. The GPU graph and speculation tests, then spec.py at batch 1 (one repeat).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
timeout 60 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py -k "graph or speculation" -q -p no:cacheprovider 2>&1 | grep -v Warn | tail -8 | tee $OUT/pytest_gpu.log
timeout 50 python3 benchmarks/spec.py --batch-sizes 1 --repeats 1 2>&1 | grep "x$\|x acc" | tee $OUT/spec_b1.log
