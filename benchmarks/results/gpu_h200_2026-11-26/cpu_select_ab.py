"""CPU: Selector time for sampled decode rows (temperature 0.8, top_p 0.95), vocab 4096 (tiny-target)."""
import sys, time, statistics
root = sys.argv[1]
sys.path.insert(0, root)
import torch
torch.set_num_threads(2)
from app.engine.request import Request
from app.engine.selection.layout import RowLayout
from app.engine.selection.selector import Selector
from app.sampling_params import SamplingParams
out = []
for batch in (1, 8, 64):
    reqs = []
    for i in range(batch):
        r = Request(f"r{i}", list(range(5)), SamplingParams(temperature=0.8, top_p=0.95))
        r.num_computed_tokens = 4
        reqs.append(r)
    logits = torch.randn(batch, 4096) * 3
    sel = Selector(0)
    ts = []
    for rep in range(300):
        t = time.perf_counter()
        layout = RowLayout.build({r: 1 for r in reqs}, logits.device)
        sel(logits, layout, rep)
        ts.append(time.perf_counter() - t)
    out.append(f"{batch}:{statistics.median(ts[50:]) * 1e3:.4f}")
print(" ".join(out))
