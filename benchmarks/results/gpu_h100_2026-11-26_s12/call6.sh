# Session 12, call 6: graphs for steps that fit one attention split (no merge) beside those for the
# longest context, and one shared logits buffer: GPU graph tests, then decode A/B at 8192 against
# c11ffe9's tree (gpu_run/base), one round each side.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
(nvidia-smi --query-gpu=name --format=csv,noheader; date -u) | tee $OUT/env.log
timeout 70 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py -q -p no:cacheprovider 2>&1 | grep -v Warn | tail -6 | tee $OUT/pytest_gpu.log
[ -f /tmp/l3/config.json ] || python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from benchmarks.decode import build_model; build_model(32, Path('/tmp/l3'))" 2>&1 | tail -1
(timeout 60 python3 gpu_run/ab_decode.py 8192 new 2>&1 | grep "decode "
 cd gpu_run/base && timeout 60 python3 ../ab_decode.py 8192 base 2>&1 | grep "decode ") | tee $OUT/decode_ab.log
date -u | tee -a $OUT/env.log
