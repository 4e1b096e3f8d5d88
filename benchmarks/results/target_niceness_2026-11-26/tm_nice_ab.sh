# One `serve run serve_config.yaml`; the TargetModel replica's threads (not its engine process)
# reniced between rounds (0, as shipped, against 10), alternated; grounded, concurrency 1 8 32.
cd /work/main
TM=$(pgrep -f "ServeReplica:specserve:TargetModel" | head -1)
for r in 1 2 3 4; do
  for nice in 0 10; do
    [ $((r % 2)) = 0 ] && nice=$([ $nice = 0 ] && echo 10 || echo 0)
    for t in $(ps -L -o tid= -p $TM); do renice -n $nice -p $t >/dev/null; done
    echo "== round $r tm nice $nice $(date -u +%T)"
    HF_HUB_OFFLINE=1 /work/venv/bin/python benchmarks/serving.py --model checkpoints/tiny-target --dataset grounded \
      --num-prompts 48 --concurrency 1 8 32 --output-len 64 --disable-tqdm 2>&1 | grep -E "Concurrency|concurrency|Mean E2EL|Mean TTFT|Mean TPOT"
  done
done
