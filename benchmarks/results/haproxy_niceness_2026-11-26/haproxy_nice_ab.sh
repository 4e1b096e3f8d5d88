# One `serve run serve_config.yaml`; HAProxy reniced between rounds (15, Ray's worker default,
# against 0), alternated; serving.py at concurrency 8 and 32 on the grounded workload.
cd /work/main
manager=$(pgrep -f "ray::HAProxyManager" | head -1)
for r in 1 2 3 4 5 6; do
  for nice in 15 0; do
    [ $((r % 2)) = 0 ] && nice=$([ $nice = 15 ] && echo 0 || echo 15)
    pid=$(pgrep -x haproxy); renice -n $nice -p $manager $pid >/dev/null
    echo "== round $r haproxy nice $(ps -o ni= -p $pid) $(date -u +%T)"
    HF_HUB_OFFLINE=1 /work/venv/bin/python benchmarks/serving.py --model checkpoints/tiny-target --dataset grounded \
      --num-prompts 96 --concurrency 8 32 --output-len 64 --disable-tqdm 2>&1 | grep -E "Concurrency|Mean E2EL|Mean TTFT|Mean TPOT|Output token throughput"
  done
done
