# Session 12, call 1: GPU tests, then decode A/B (a32c7ce's tree in gpu_run/base against this one:
# lm_head in the CUDA graph, no fp32 cast for greedy steps, one-split sequences skip the merge),
# at max_model_len 8192 (a deployment's) and 272 (decode.py's default), alternated.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
(nvidia-smi --query-gpu=name,memory.total --format=csv; date -u) | tee $OUT/env.log
timeout 150 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py tests/triton_kernels/test_gpu_fused_layers.py \
  tests/triton_kernels/test_filtered_sampling.py tests/test_selection.py -q -p no:cacheprovider -x 2>&1 | grep -v Warn | tee $OUT/pytest_gpu.log
python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from benchmarks.decode import build_model; build_model(32, Path('/tmp/l3'))" 2>&1 | tail -1
for len in 8192 272; do
  for r in $([ $len = 8192 ] && echo 1 2 || echo 1); do
    for side in base new; do
      [ $r = 2 ] && side=$([ $side = base ] && echo new || echo base)
      if [ $side = base ]; then (cd gpu_run/base && timeout 90 python3 ../ab_decode.py $len base 2>&1 | grep "decode ");
      else timeout 90 python3 gpu_run/ab_decode.py $len new 2>&1 | grep "decode "; fi
    done
  done
done 2>&1 | tee $OUT/decode_ab.log
date -u | tee -a $OUT/env.log
