#!/bin/bash
# per-process CPU during a c=32 load against the running serve
cd /work/main
P=/work/venv/bin/python
$P benchmarks/schedstat.py snapshot benchmarks/out/s14/load0.json "" >/dev/null
HF_HUB_OFFLINE=1 $P benchmarks/serving.py --model checkpoints/tiny-target --num-prompts ${N:-192} --concurrency 32 --input-len 128 --output-len 64 --dataset grounded 2>&1 | grep -E "duration|Output token|Mean TTFT|Mean TPOT|Mean E2EL"
$P benchmarks/schedstat.py snapshot benchmarks/out/s14/load1.json "" >/dev/null
$P - <<'PY'
import json,collections
a=json.load(open('benchmarks/out/s14/load0.json'));b=json.load(open('benchmarks/out/s14/load1.json'))
per=collections.Counter(); wait=collections.Counter()
for k,(cmd,name,cpu,w) in b.items():
    c0,w0=a.get(k,[0,0,0,0])[2:]
    per[(k.split('/')[0],cmd[:50])]+= (cpu-c0)/1e9; wait[(k.split('/')[0],cmd[:50])]+=(w-w0)/1e9
for (p,c),v in per.most_common(14): print(f"{v:6.3f} s wait {wait[(p,c)]:6.3f}  {p} {c}")
print("total",sum(per.values()))
PY
