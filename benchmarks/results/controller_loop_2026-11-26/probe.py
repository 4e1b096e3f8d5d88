"""c=1 grounded requests; per request the client send/first/end times, keyed by response id."""
import json, sys, time, requests
sys.path.insert(0, "/work/main")
from benchmarks.grounded_prompts import input_grounded_texts
n = int(sys.argv[1]); out = sys.argv[2]; max_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
texts = input_grounded_texts(n + 2, seed=0)
rows = []
s = requests.Session()
for i, t in enumerate(texts):
    payload = {"model": "tiny-target", "prompt": t, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    t0 = time.time(); first = None; rid = None
    with s.post("http://127.0.0.1:8000/v1/completions", json=payload, stream=True) as r:
        for line in r.iter_lines():
            if line and first is None and line != b"data: [DONE]":
                first = time.time(); rid = json.loads(line[6:])["id"]
    end = time.time()
    if i >= 2:
        rows.append({"id": rid, "send": t0, "first": first, "end": end})
json.dump(rows, open(out, "w"))
