# The InputStream of a commit (argv[1]: its deployments/custom_tools.py, from `git show REF:deployments/custom_tools.py > F`)
# against the work tree's: a patch of 500 / 5,000 / 20,000 characters streamed 4 characters a piece, best of 3, alternated.
import json, sys, time, importlib.util
sys.path.insert(0, '/work/main')
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
old = load(sys.argv[1], 'old_ct'); new = load('/work/main/deployments/custom_tools.py', 'new_ct')
for n in (500, 5000, 20000):
    text = ("*** Update File: a.py\n@@\n-    x = 1\n+    x = \"é\" \\ 2\n" * (n // 40 + 1))[:n]
    arguments = json.dumps({"input": text})
    pieces = [arguments[i:i + 4] for i in range(0, len(arguments), 4)]
    res = {}
    for rnd in range(3):
        for name, mod in (("old", old), ("new", new)):
            t = time.perf_counter(); s = mod.InputStream(); out = "".join(s.feed(p) for p in pieces)
            res.setdefault(name, []).append(time.perf_counter() - t); assert out == text
    o, w = min(res["old"]), min(res["new"])
    print(f"input {n} chars, {len(pieces)} pieces: old {o*1e3:.2f} ms, new {w*1e3:.2f} ms, old/new {o/w:.1f}x")
