# Session 15, call 4: the GPU tests call 3 did not reach (its count assertion was wrong: 4 plain
# sizes up to 8, not 5), then spec.py at batch 1 and 64 A/B against b40b487's tree
# (gpu_run/base), 2 rounds alternated: did verify graphs cost the k = 0 steps anything?
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
set -o pipefail
timeout 80 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py -k "graph or speculation" -q -p no:cacheprovider 2>&1 | grep -v Warn | tail -8 | tee $OUT/pytest_gpu.log
for r in 1 2; do for side in new base; do
  [ $r = 2 ] && side=$([ $side = base ] && echo new || echo base)
  echo "== round $r $side"
  if [ $side = base ]; then (cd gpu_run/base && timeout 45 python3 benchmarks/spec.py --batch-sizes 1 64 --repeats 1 2>&1 | grep "x$\|x acc");
  else timeout 45 python3 benchmarks/spec.py --batch-sizes 1 64 --repeats 1 2>&1 | grep "x$\|x acc"; fi
done; done 2>&1 | tee $OUT/spec_ab.log
