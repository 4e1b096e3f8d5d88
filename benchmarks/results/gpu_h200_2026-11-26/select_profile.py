"""Where the sampled selection's time goes on the GPU: [R, 128256] logits, temperature 0.8, top_p 0.95."""
import statistics, sys, torch
sys.path.insert(0, ".")
from torch.profiler import profile, ProfilerActivity
from app.engine.selection.distribution import row_probs
from app.engine.selection.verify import sample_inverse_cdf

def bench(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

V = 128256
for R in (1, 64, 256):
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(R, V, device="cuda", generator=g) * 3).bfloat16()
    dev = dict(device="cuda")
    temp = torch.full((R,), 0.8, **dev); top_k = torch.zeros(R, dtype=torch.long, **dev)
    top_p = torch.full((R,), 0.95, **dev); min_p = torch.zeros(R, **dev)
    u = torch.rand(R, dtype=torch.float64, **dev)
    sampled = lambda: sample_inverse_cdf(row_probs(logits, temp, top_k, top_p, min_p, True), u)
    nosort = lambda: sample_inverse_cdf(row_probs(logits, temp, top_k, top_p, min_p, False), u)
    greedy = lambda: logits.argmax(-1)
    sort_only = lambda: logits.float().sort(dim=-1, descending=True)
    print(f"R={R}: sampled top_p {bench(sampled):.3f} ms, temperature only {bench(nosort):.3f} ms, "
          f"argmax {bench(greedy):.3f} ms, sort alone {bench(sort_only):.3f} ms", flush=True)
    if R == 256:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            sampled(); torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))
