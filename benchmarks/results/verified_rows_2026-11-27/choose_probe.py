"""choose() on sampled batches where some requests verify 4 drafts (top_p 0.95, temperature 0.8),
one thread; the tree given as argv[1]."""
import sys, time
sys.path.insert(0, sys.argv[1])
import torch
from app.engine.request import Request
from app.engine.selection.layout import RowLayout
from app.engine.selection.selector import choose
from app.sampling_params import SamplingParams
torch.set_num_threads(1)
V = 4096
def req(i, k):
    r = Request(f"r{i}", list(range(40)), SamplingParams(temperature=0.8, top_p=0.95))
    r.num_computed_tokens = 39
    if k: r.set_spec(list(range(1, k + 1)))
    return r
out = []
for batch, drafted in ((8, 1), (32, 2), (32, 8), (32, 32)):
    reqs = [req(i, 4 if i < drafted else 0) for i in range(batch)]
    layout = RowLayout.build({r: r.num_tokens - r.num_computed_tokens for r in reqs}, torch.device("cpu"))
    logits = torch.randn(layout.num_rows, V) * 3
    t = []
    for _ in range(21):
        t0 = time.perf_counter(); choose(logits, layout, 1); t.append(time.perf_counter() - t0)
    out.append(f"{batch}/{drafted}: {sorted(t)[10] * 1e3:.2f}")
print(sys.argv[1], " ".join(out))
