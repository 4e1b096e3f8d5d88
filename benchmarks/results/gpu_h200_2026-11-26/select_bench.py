"""The sampled selection of [R, 128256] fp32 logits (what the engine's lm_head gives): the sort
path against the sort-free kernel (top-p by rejection, and by search alone)."""
import statistics, sys, torch
sys.path.insert(0, ".")
from app.engine.selection.distribution import row_probs
from app.engine.selection.verify import sample_inverse_cdf
from app.engine.selection.distribution import sample_on_device
from kernels.filtered_sampling import MAX_ROUNDS

def bench(fn, n=15):
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
    logits = torch.randn(R, V, device="cuda", generator=g) * 3
    dev = dict(device="cuda")
    for label, k, p, mp in (("top_p 0.95", 0, 0.95, 0.0), ("top_k 50 top_p 0.9 min_p 0.05", 50, 0.9, 0.05), ("temperature only", 0, 1.0, 0.0)):
        temp = torch.full((R,), 0.8, **dev); top_k = torch.full((R,), k, dtype=torch.long, **dev)
        top_p = torch.full((R,), p, **dev); min_p = torch.full((R,), mp, **dev)
        u = torch.rand(R, MAX_ROUNDS, dtype=torch.float64, **dev)
        u1 = u[:, :1].contiguous()
        t_sort = bench(lambda: sample_inverse_cdf(row_probs(logits, temp, top_k, top_p, min_p, True), u[:, 0]))
        t_rej = bench(lambda: sample_on_device(logits, temp, top_k, top_p, min_p, k, u))
        t_search = bench(lambda: sample_on_device(logits, temp, top_k, top_p, min_p, k, u1))
        print(f"R={R:3d} {label:30s}: sort path {t_sort:.3f} ms | device draw {t_rej:.3f} ms "
              f"({t_sort / t_rej:.1f}x) | with top-p by search {t_search:.3f} ms", flush=True)
