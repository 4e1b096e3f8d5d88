import json, sys, glob, statistics as st, collections
rows = json.load(open(sys.argv[1]))
marks = collections.defaultdict(dict)
for f in glob.glob("/tmp/s14trace/*.log"):
    for line in open(f):
        stage, rid, t = line.split()
        if stage == "ing_in":
            rid, t0 = rid.split("@"); marks[rid]["ing_in"] = float(t0); continue
        rid = rid.rsplit("-", 1)[0] if stage in ("tm_in", "tm_first", "eng_add", "eng_pub") else rid
        marks[rid][stage] = float(t)
order = ["send", "ing_in", "ing_tok", "ing_send", "tm_in", "eng_add", "eng_pub", "tm_first", "ing_first", "first", "end"]
gaps = collections.defaultdict(list)
for r in rows:
    m = {**marks.get(r["id"], {}), "send": r["send"], "first": r["first"], "end": r["end"]}
    if not all(k in m for k in order): continue
    for a, b in zip(order, order[1:]):
        gaps[f"{a}->{b}"].append(1e3 * (m[b] - m[a]))
for k, v in gaps.items():
    print(f"{k:22s} median {st.median(v):7.2f} ms  mean {st.mean(v):7.2f}  (n={len(v)})")
