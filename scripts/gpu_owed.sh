#!/usr/bin/env bash
# The GPU figures the sessions without a GPU owe, by part. A task lent a GPU has 15 minutes of
# device time in all, the machine's start (1-2 min) included, so two calls back to back (the
# machine stays warm 30 s), each well inside its timeout, with time left to rerun one:
#   run(command="bash scripts/gpu_owed.sh tests kernels decode", carry=[".whl", "gpu_run"], timeout_s=330)
#   run(command="bash scripts/gpu_owed.sh ab", carry=[".whl", "gpu_run"], timeout_s=400)
# and only with 3 minutes of budget left: run(command="bash scripts/gpu_owed.sh spec", ...).
# (no argument: every part). Durations on an H100 (2026-11-26): tests ~70 s, kernels ~25 s,
# decode ~90 s with traces, ab ~45 s a side (6 sides) and ~25 s for each of its 2 batch-1 runs
# without the split grid, spec ~55 s. `.whl` holds the cp312 wheels the device lacks
# (outlines_core; see the device tool's README). Logs go to $OUT (or ./gpu_out).
#
# Owed since 2026-11-26 (session 16): the GPU tests of the draft's tail graphs without the lm_head
# (bc0a591); spec.py over 2 repeats with verify and tail graphs and adaptive speculation's
# drafted share (10da319); decode.py after them, and where the GPU idles between decode steps at
# batch 1 (5.8-7.4% in the last runs, short of issue 17's 165 tok/s): decode.py --trace-dir
# writes the traces and prints benchmarks/step_gaps.py's reading of each.
# Owed since 2026-11-27 (session 19): pytest -m gpu over the graphs that read their inputs in one
# copy and choose the step's tokens (4d0c2b6, 2e24ee1), and the decode A/B ("ab") against
# e9e0f1c, the commit before them. For the A/B, put e9e0f1c's files in a git-ignored folder and
# carry it:
#   echo /gpu_run/ >> .git/info/exclude; mkdir -p gpu_run/base && git archive e9e0f1c | tar -x -C gpu_run/base
# Owed since 2026-11-27 (session 20): decode attention summed in fixed splits of 64 keys, with one
# program per split where a grid of partitions would leave SMs idle. pytest's test_decode_bf16
# checks that both grids give the same bits on the GPU (if not, no small batch may take the
# split grid: `spreads_by_split` must return False until they do). "kernels" measures what the
# per-split folds cost the partition grid at 64 x 4096 and 256 x 256 (split 64 against split
# 1024, one fold a partition) and what the split grid gains at batch 1 (contexts 256 and 1024)
# and at batch 16 (the largest batch that takes it);
# "decode" the whole step; "ab" against e9e0f1c, and this tree at batch 1 without the split
# grid. If the folds cost more than the batch-1 grid gains, a larger split (128, 256) trades
# the two; the split size is global, never chosen by the batch.
# Changed since by session 21 (no GPU either): a split is one tile (32 keys for 16-bit caches),
# so a partition program carries one softmax state, as before the splits. Compiled for sm_90
# on the CPU (tests/triton_kernels/hopper_compile.py), session 20's kernel took 142-152
# registers a thread where the kernel before the splits took 80-116: 3 programs an SM instead
# of 4-6. Now 96-112. "kernels" times both trees' kernels at the two shapes (e9e0f1c's from
# gpu_run/base, which call 1 now carries too). The in-graph sampler's passes over the vocabulary
# now pipeline their loads (they waited out a round trip per block): decode.py's sampled rows.
# And programmatic dependent launch (kernels/dependent_launch.py, off by default): "tests" checks
# its tokens (test_dependent_launch_gives_the_same_tokens), "ab" times this tree with it on in
# each round; turn ENABLED on only if it is faster at batch 1 and no slower at 256.
set -o pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
PARTS=${*:-tests decode ab spec kernels}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
(nvidia-smi --query-gpu=name,memory.total --format=csv; git log --oneline -1; git status --short; date -u) \
  | tee "$OUT/env.log"

for part in $PARTS; do
  case $part in
  tests)
    timeout 180 python3 -m pytest -m gpu tests/triton_kernels/test_gpu.py tests/triton_kernels/test_gpu_fused_layers.py \
      tests/triton_kernels/test_filtered_sampling.py tests/test_selection.py -q -p no:cacheprovider 2>&1 \
      | grep -v Warn | tail -30 | tee "$OUT/pytest_gpu.log" ;;
  decode)  # also writes the Llama-3-8B-shaped checkpoint /tmp/l3 that "ab" loads
    timeout 240 python3 benchmarks/decode.py --skip-hf --max-model-len 8192 --batch-sizes 1 64 256 --gen-len 128 \
      --model-dir /tmp/l3 --trace-dir "$OUT/traces" 2>&1 | grep -v "Warn\|warn_once\|Loading" | tee "$OUT/decode.log" ;;
  ab)  # two rounds, the sides alternated
    [ -d gpu_run/base ] || { echo "no gpu_run/base: skipping the A/B" | tee "$OUT/decode_ab.log"; continue; }
    [ -f /tmp/l3/config.json ] || python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; \
from benchmarks.decode import build_model; build_model(32, Path('/tmp/l3'))" 2>&1 | tail -1
    for round in 1 2; do
      timeout 90 python3 benchmarks/ab_decode.py --label "new-$round" --batch-sizes 1 256 --sampled-batch-sizes 256 \
        2>&1 | grep "decode "
      (cd gpu_run/base && timeout 90 python3 ../../benchmarks/ab_decode.py --label "base-$round" --batch-sizes 1 256 \
        --sampled-batch-sizes 256 2>&1 | grep "decode ")
      # this tree at batch 1 without the per-split attention grid: what that grid alone gains
      timeout 60 python3 benchmarks/ab_decode.py --label "partition-grid-$round" --batch-sizes 1 --sampled-batch-sizes \
        --partition-grid-only 2>&1 | grep "decode "
      # this tree with programmatic dependent launch
      timeout 90 python3 benchmarks/ab_decode.py --label "dependent-launch-$round" --batch-sizes 1 256 \
        --sampled-batch-sizes 256 --dependent-launch 2>&1 | grep "decode "
    done | tee "$OUT/decode_ab.log" ;;
  spec)
    timeout 150 python3 benchmarks/spec.py --batch-sizes 1 4 16 64 --repeats 2 --result-json "$OUT/spec_gpu.json" 2>&1 \
      | grep -v "Warn\|warn_once" | tee "$OUT/spec_gpu.log" ;;
  kernels)
    # At 64 x 4096 (issue 17's shape) and at 256 x 256 (decode.py's batch 256): splits (tiles)
    # of 32 and 64 keys, 2 or 3 stages; then e9e0f1c's kernel, before the splits, at tiles of 32
    # (its adopted configuration) and 64
    for shape in "--batch 64 --context 4096" "--batch 256 --context 256"; do
      timeout 60 python3 benchmarks/kernels.py --full $shape --partition 1024 --split 32 64 \
        --dots 16 --grid head --num-warps 4 --num-stages 2 3 2>&1 | grep -v Warn
      [ -d gpu_run/base ] && (cd gpu_run/base && timeout 60 python3 benchmarks/kernels.py --full $shape \
        --partition 1024 --block-n 32 64 --dots 16 --grid head --num-warps 4 --num-stages 3 2>&1 | grep -v Warn)
    done | tee "$OUT/kernels.log"
    # Small batches: one program per KV head walking the context (~11 us a layer at batch 1 and
    # ~200 keys, note16) against a program per split and the merge; batch 16 is the largest
    # captured size `spreads_by_split` gives the split grid (128 partition programs < 132 SMs)
    for shape in "--batch 1 --context 256" "--batch 1 --context 1024" "--batch 16 --context 256"; do
      timeout 40 python3 benchmarks/kernels.py --full $shape --partition 1024 --split 32 64 \
        --programs partition split --dots 16 --grid head --num-warps 4 --num-stages 3 2>&1 | grep -v Warn
    done | tee "$OUT/kernels_b1.log" ;;
  *) echo "unknown part $part (tests decode ab spec kernels)" ;;
  esac
done
