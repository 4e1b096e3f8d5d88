"""A Selector call (layout built, chosen, copied back) for sampled rows without drafts
(temperature 0.8, top_p 0.95), one thread; the tree is argv[1]."""
import sys, time
sys.path.insert(0, sys.argv[1])
import torch
from app.engine.request import Request
from app.engine.selection.layout import RowLayout
from app.engine.selection.selector import Selector
from app.sampling_params import SamplingParams
torch.set_num_threads(1)
out = []
for n in (1, 8, 64, 256):
    reqs = []
    for i in range(n):
        r = Request(f"r{i}", list(range(40)), SamplingParams(temperature=0.8, top_p=0.95)); r.num_computed_tokens = 39
        reqs.append(r)
    logits = torch.randn(n, 4096) * 3
    sel = Selector(0)
    def one():
        return sel(logits, RowLayout.build({r: 1 for r in reqs}, torch.device("cpu")), 5)
    for _ in range(10): one()
    t = []
    for _ in range(60):
        t0 = time.perf_counter(); one(); t.append(time.perf_counter() - t0)
    out.append(f"{n}: {sorted(t)[30]*1e6:.0f} us")
print(sys.argv[1], ", ".join(out))
