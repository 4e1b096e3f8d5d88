# A/B of the adaptive accounting: base (c9748c3, a worktree) against the work tree (a32c7ce), alternated, engine alone.
source /work/venv/bin/activate
export HF_HUB_OFFLINE=1
PROBE=/work/main/benchmarks/results/served_lookup_2026-11-26/sampled_engine.py
for r in 1 2; do
  for side in base work; do
    if [ $r = 2 ]; then side=$([ $side = base ] && echo work || echo base); fi
    dir=/work/main; [ $side = base ] && dir=/work/main/benchmarks/out/s12/base
    echo "== $side (round $r)"
    (cd $dir && python $PROBE 2>/dev/null)
  done
done
