import json, glob, os, sys, collections
files = sorted(glob.glob("/tmp/admit_log/*.jsonl"), key=os.path.getmtime)
rows = []
for f in files:
    for line in open(f):
        d = json.loads(line); d["pid"] = os.path.basename(f); rows.append(d)
rows.sort(key=lambda d: d["t"])
# split into deploys: gap > 5 s between admissions
groups = []; last = None
for d in rows:
    if last is None or d["t"] - last > 5: groups.append([])
    groups[-1].append(d); last = d["t"]
for g in groups:
    q = sum(d["n"] for d in g); hit = sum(d["hit"] for d in g)
    c = collections.Counter()
    for d in g:
        first_miss = d["hit"] // 16
        for i, s in enumerate(d["seen"]):
            pos = first_miss + i
            part = "sys" if pos < 48 else "conv"
            c[(part, "evicted" if s else "new")] += 16
        c["tail_tokens"] += d["n"] - d["full"] * 16
    pids = collections.Counter(d["pid"] for d in g)
    print(f"{len(g)} admissions pids {dict(pids)} hit rate {hit/q:.3f}  queried {q}")
    for k, v in sorted(c.items(), key=str):
        print(f"   {k}: {v} tokens ({v/q:.3f})")
    pre = sum(1 for d in g if d["pre"]); print("   preempted readmissions", pre)
    # cached blocks at admission
    import statistics
    print("   free blocks median", statistics.median(d["free"] for d in g), "cached median", statistics.median(d["cached"] for d in g))
