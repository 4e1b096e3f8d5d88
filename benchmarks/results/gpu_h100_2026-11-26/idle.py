import gzip, json, sys, collections
tr = json.load(gzip.open(sys.argv[1]))
ev = [e for e in tr["traceEvents"] if e.get("ph") == "X"]
gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "engine.step" and e.get("cat") == "user_annotation")
start = steps[1][0]  # from the second step's call on: the first follows a drained pipeline
gpu = [(a, b) for a, b in gpu if a >= start]
lo, hi = gpu[0][0], gpu[-1][1]
busy = 0; reach = None; hist = collections.Counter(); gaps_total = collections.Counter()
for a, b in gpu:
    if reach is None or a > reach:
        if reach is not None:
            g = a - reach
            k = "<2us" if g < 2 else "2-8us" if g < 8 else "8-50us" if g < 50 else ">50us"
            hist[k] += 1; gaps_total[k] += g
        busy += b - a; reach = b
    elif b > reach:
        busy += b - reach; reach = b
print(f"{sys.argv[1]}: window {hi - lo:.0f} us, busy {busy:.0f}, idle {100 * (1 - busy / (hi - lo)):.1f}%")
for k in ("<2us", "2-8us", "8-50us", ">50us"):
    print(f"  gaps {k}: {hist[k]} totalling {gaps_total[k]:.0f} us")
