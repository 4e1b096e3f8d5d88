"""apply_penalties on 32 rows with min_tokens and a bad word, both trees alternated in one process."""
import importlib.util, sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from app.engine.request import Request
from app.engine.selection.layout import RowLayout
from app.sampling_params import SamplingParams
def load(root, name):
    spec = importlib.util.spec_from_file_location(name, root + "/app/engine/selection/penalties.py")
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m
mods = {"base": load("/tmp/wt_base", "pen_base"), "new": load("/work/main", "pen_new")}
V = 4096
reqs = []
for i in range(32):
    r = Request(f"r{i}", list(range(1, 20)), SamplingParams(temperature=0.8, max_tokens=64, min_tokens=60, bad_words_token_ids=[[13], [262, 262]]), eos_token_ids=(2,))
    for t in range(30): r.append_token(100 + t)
    r.num_computed_tokens = r.num_tokens - 1; r.set_spec([])
    reqs.append(r)
logits = torch.randn(32, V)
times = {k: [] for k in mods}
for rnd in range(30):
    for k, m in (list(mods.items()) if rnd % 2 else list(mods.items())[::-1]):
        t = time.perf_counter()
        for _ in range(20):
            pen = m.Penalties.build([(r, i) for i, r in enumerate(reqs)], logits.device)
            m.apply_penalties(logits, pen)
        times[k].append((time.perf_counter() - t) / 20 * 1e6)
for k, v in times.items(): print(k, f"median {statistics.median(v):.1f} us per step")
print("new/base", statistics.median(times["new"]) / statistics.median(times["base"]))
times = {k: [] for k in mods}
pens = {k: m.Penalties.build([(r, i) for i, r in enumerate(reqs)], logits.device) for k, m in mods.items()}
for rnd in range(40):
    for k, m in (list(mods.items()) if rnd % 2 else list(mods.items())[::-1]):
        t = time.perf_counter()
        for _ in range(20):
            m.apply_penalties(logits, pens[k])
        times[k].append((time.perf_counter() - t) / 20 * 1e6)
for k, v in times.items(): print("apply only", k, f"median {statistics.median(v):.1f} us")
times = {k: [] for k in mods}
for rnd in range(40):
    for k, m in (list(mods.items()) if rnd % 2 else list(mods.items())[::-1]):
        t = time.perf_counter()
        for _ in range(20):
            m.Penalties.build([(r, i) for i, r in enumerate(reqs)], logits.device)
        times[k].append((time.perf_counter() - t) / 20 * 1e6)
for k, v in times.items(): print("build only", k, f"median {statistics.median(v):.1f} us")
