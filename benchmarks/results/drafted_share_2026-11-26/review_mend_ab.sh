for r in 1 2 3; do for side in new base; do
  [ $((r % 2)) = 0 ] && side=$([ $side = base ] && echo new || echo base)
  dir=$([ $side = base ] && echo /tmp/base_wt || echo /work/main)
  echo "== round $r $side"
  (cd $dir && HF_HUB_OFFLINE=1 /work/venv/bin/python benchmarks/spec.py --batch-sizes 1 2 --repeats 1 --model /work/main/checkpoints/tiny-target --draft-model /work/main/checkpoints/tiny-draft 2>&1 | grep "x  median" | grep -E "alone|n-gram" | sed -E "s/ +median.*//")
done; done
