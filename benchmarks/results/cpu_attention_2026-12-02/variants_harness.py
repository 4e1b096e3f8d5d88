"""Several paged_attention.cpp variants (files named on the command line, the first the baseline),
alternated in rounds in one process, one thread, at several decode and verify shapes of the
default model, each call on a cold cache (spread 32). Run it with
GLIBC_TUNABLES=glibc.malloc.hugetlb=1, as the engine process runs (variants.txt)."""
import statistics, sys, tempfile, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from kernels.cpu import build_paged_attention as build
torch.set_num_threads(1)
files = sys.argv[1:]
shapes = [(1, 192, 1), (8, 192, 1), (32, 192, 1), (32, 192, 4), (32, 400, 1)]
tmp = Path(tempfile.mkdtemp())
kernels = {Path(f).stem: build(Path(f).read_text(), f"attn_{Path(f).stem}", tmp / Path(f).stem) for f in files}
spread, rounds = 32, 10
for batch, context, qlen in shapes:
    torch.manual_seed(0)
    heads, kv_heads, head_dim, bs = 8, 4, 32, 16
    bps = -(-context // bs); pool = batch * bps * spread
    kv = torch.randn(2, pool, bs, kv_heads, head_dim)
    order = torch.randperm(pool).to(torch.int32)
    tables = [order[i*batch*bps:(i+1)*batch*bps].view(batch, bps).contiguous() for i in range(spread)]
    tokens = batch * qlen
    q = torch.randn(tokens, heads, head_dim)
    starts = torch.arange(0, tokens + 1, qlen, dtype=torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32); lens[::2] -= bs // 2
    seqs = torch.arange(batch)
    outs = {k: torch.empty_like(q) for k in kernels}
    for k, fn in kernels.items():
        fn(q, kv, tables[0], starts, lens, seqs, head_dim ** -0.5, outs[k])
    ref = outs[next(iter(kernels))]
    for k in kernels: assert (outs[k] - ref).abs().max() < 1e-5, k
    times = {k: [] for k in kernels}
    reps = max(1, 12800 // (batch * context) )
    for r in range(rounds):
        names = list(kernels) if r % 2 == 0 else list(reversed(kernels))
        for k in names:
            fn, out = kernels[k], outs[k]
            t = time.perf_counter()
            for _ in range(reps):
                for tb in tables: fn(q, kv, tb, starts, lens, seqs, head_dim ** -0.5, out)
            times[k].append((time.perf_counter() - t) / (reps * spread) * 1e6)
    base = statistics.median(times[next(iter(kernels))])
    print(f"b{batch} ctx{context} q{qlen}: " + "  ".join(f"{k} {statistics.median(v):7.1f}us ({base/statistics.median(v):.2f}x)" for k, v in times.items()), flush=True)
