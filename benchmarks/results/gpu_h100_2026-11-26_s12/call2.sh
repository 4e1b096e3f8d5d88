# Session 12, call 2: the fixed kernel (branch-typed pointers) through the GPU tests, the decode A/B
# at max_model_len 8192 (2 rounds, alternated), then spec.py (issue 18's owed GPU figure).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
(nvidia-smi --query-gpu=name --format=csv,noheader; date -u) | tee $OUT/env.log
timeout 120 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py tests/triton_kernels/test_gpu_fused_layers.py \
  tests/triton_kernels/test_filtered_sampling.py tests/test_selection.py -q -p no:cacheprovider 2>&1 | grep -v Warn | tail -15 | tee $OUT/pytest_gpu.log
[ -f /tmp/l3/config.json ] || python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from benchmarks.decode import build_model; build_model(32, Path('/tmp/l3'))" 2>&1 | tail -1
for r in 1 2; do
  for side in new base; do
    [ $r = 2 ] && side=$([ $side = base ] && echo new || echo base)
    if [ $side = base ]; then (cd gpu_run/base && timeout 80 python3 ../ab_decode.py 8192 base 2>&1 | grep "decode ");
    else timeout 80 python3 gpu_run/ab_decode.py 8192 new 2>&1 | grep "decode "; fi
  done
done 2>&1 | tee $OUT/decode_ab.log
timeout 170 python3 benchmarks/spec.py --batch-sizes 1 4 16 64 --repeats 2 --result-json $OUT/spec_gpu.json 2>&1 \
  | grep -v "Warn\|warn_once" | tee $OUT/spec_gpu.log
date -u | tee -a $OUT/env.log
