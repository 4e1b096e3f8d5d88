"""CPU: Selector time for sampled rows verifying 4 drafts (temperature 0.8, top_p 0.95), vocab 4096."""
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
for batch in (1, 4):
    reqs = []
    for i in range(batch):
        r = Request(f"r{i}", list(range(5)), SamplingParams(temperature=0.8, top_p=0.95))
        r.num_computed_tokens = 4
        r.set_spec([1, 2, 3, 4], torch.rand(4, 4096).softmax(-1))
        reqs.append(r)
    logits = torch.randn(batch * 5, 4096) * 3
    sel = Selector(0)
    ts = []
    for rep in range(300):
        t = time.perf_counter()
        layout = RowLayout.build({r: 5 for r in reqs}, logits.device)
        sel(logits, layout, rep)
        ts.append(time.perf_counter() - t)
    out.append(f"{batch}x5:{statistics.median(ts[50:]) * 1e3:.4f}")
print(" ".join(out))
