# CPU seconds per process (ray workers by their title) during 24 sampled copying requests at concurrency 1.
snap() { for p in $(pgrep -f "ray::|engine_process|ServeReplica|ProxyActor"); do
  t=$(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null); n=$(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-60); echo "$p $t $n"; done; }
snap > /tmp/cpu_before.txt
python benchmarks/serving.py --model checkpoints/tiny-target --num-prompts 24 --concurrency 1 --input-len 128 --output-len 64 --dataset grounded --temperature 0.8 --top-p 0.95 --disable-tqdm 2>&1 | grep -E "Mean (TTFT|TPOT|E2EL)"
snap > /tmp/cpu_after.txt
python - <<'PY'
before = {l.split()[0]: (float(l.split()[1]), " ".join(l.split()[2:])) for l in open("/tmp/cpu_before.txt") if len(l.split()) > 1}
rows = []
for l in open("/tmp/cpu_after.txt"):
    parts = l.split()
    if len(parts) < 2 or parts[0] not in before: continue
    d = (float(parts[1]) - before[parts[0]][0]) / 100
    if d > 0.05: rows.append((d, " ".join(parts[2:])))
for d, n in sorted(rows, reverse=True): print(f"{d:6.2f} s  {n}")
PY
