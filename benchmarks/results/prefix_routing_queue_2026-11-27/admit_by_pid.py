import json, glob, os, collections
for f in sorted(glob.glob("/tmp/admit_log/*.jsonl")):
    rows=[json.loads(l) for l in open(f)]
    q=sum(d["n"] for d in rows); h=sum(d["hit"] for d in rows)
    c=collections.Counter()
    for d in rows:
        fm=d["hit"]//16
        for i,s in enumerate(d["seen"]):
            c[("sys" if fm+i<48 else "conv", "ev" if s else "new")]+=16
    syss=len({d["first"] for d in rows})
    print(os.path.basename(f), len(rows), "hit", round(h/q,3), "sys prompts seen", syss, {k: round(v/q,3) for k,v in c.items()})
