#!/usr/bin/env python
"""The CPU paged-attention kernel (specserve_kernels/cpu/paged_attention.cpp) of the work tree against
the same file at another commit, alternated in rounds, one thread, on decode-shaped calls of
the default model (8 heads, 4 KV heads, head_dim 32, blocks of 16).

    python benchmarks/cpu_attention.py --ref HEAD~1 --batch 8 --context 160

`--spread N` places each call's blocks at random in a pool N calls large and cycles through
N block tables, so each call finds its K and V out of cache, as in the engine, where a step's
weights and every layer's KV pass through the cache between two reads of the same layer;
`--spread 1` times the kernel on a warm cache. Outputs of the two builds are compared first.
It runs with glibc's malloc on transparent huge pages, as the engine process does
(`child_environment`); on 4 KiB pages a cold call also pays TLB misses the engine does not
(`--small-pages`: 1.2x slower at 32 sequences of 400 keys, benchmarks/RESULTS.md, 2026-12-02).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specserve_kernels.cpu import build_paged_attention  # noqa: E402

KERNEL = "specserve_kernels/cpu/paged_attention.cpp"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="HEAD", help="the commit whose kernel is the baseline")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=160)
    parser.add_argument("--query-len", type=int, default=1, help="1: decode; 1 + k: verification")
    parser.add_argument("--spread", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=400, help="timed calls per round and build")
    parser.add_argument("--small-pages", action="store_true", help="leave malloc on 4 KiB pages")
    args = parser.parse_args()
    if not args.small_pages and "glibc.malloc.hugetlb=" not in os.environ.get("GLIBC_TUNABLES", ""):
        from app.engine.engine_process import child_environment
        os.execve(sys.executable, [sys.executable, *sys.argv], child_environment(dict(os.environ), sys.path))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ref_source = subprocess.run(["git", "show", f"{args.ref}:{KERNEL}"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {args.ref: build_paged_attention(ref_source, "attention_ref", Path(tmp) / "ref"),
                   "work tree": build_paged_attention((ROOT / KERNEL).read_text(), "attention_work", Path(tmp) / "work")}
        heads, kv_heads, head_dim, block_size = 8, 4, 32, 16
        blocks_per_seq = -(-args.context // block_size)
        pool = args.batch * blocks_per_seq * args.spread
        kv_cache = torch.randn(2, pool, block_size, kv_heads, head_dim)
        order = torch.randperm(pool).to(torch.int32)
        tables = [order[i * args.batch * blocks_per_seq:(i + 1) * args.batch * blocks_per_seq]
                  .view(args.batch, blocks_per_seq).contiguous() for i in range(args.spread)]
        tokens = args.batch * args.query_len
        query = torch.randn(tokens, heads, head_dim)
        starts = torch.arange(0, tokens + 1, args.query_len, dtype=torch.int32)
        seq_lens = torch.full((args.batch,), args.context, dtype=torch.int32)
        seq_lens[::2] -= block_size // 2  # half the sequences end inside a block
        seqs = torch.arange(args.batch)
        scale = head_dim ** -0.5

        def call(fn, table, out):
            fn(query, kv_cache, table, starts, seq_lens, seqs, scale, out)

        outs = {}
        for label, fn in kernels.items():
            outs[label] = torch.empty_like(query)
            call(fn, tables[0], outs[label])
        diff = (outs[args.ref] - outs["work tree"]).abs().max().item()
        print(f"max |work tree - {args.ref}| = {diff:.3g}")
        per_call = {label: [] for label in kernels}
        repeats = max(1, args.calls // args.spread)
        for r in range(args.rounds):
            labels = list(kernels) if r % 2 == 0 else list(reversed(kernels))
            for label in labels:
                fn, out = kernels[label], outs[label]
                for table in tables:
                    call(fn, table, out)
                started = time.perf_counter()
                for _ in range(repeats):
                    for table in tables:
                        call(fn, table, out)
                per_call[label].append((time.perf_counter() - started) / (repeats * args.spread) * 1e6)
    print(f"batch {args.batch}, context {args.context}, query length {args.query_len}, spread {args.spread}, "
          f"{args.rounds} rounds (us per call, median):")
    for label, times in per_call.items():
        print(f"  {label:>10}: {statistics.median(times):8.1f}   rounds: {', '.join(f'{t:.0f}' for t in times)}")
    ratio = statistics.median(per_call[args.ref]) / statistics.median(per_call["work tree"])
    print(f"{args.ref} / work tree: {ratio:.2f}x (above 1: the work tree is faster)")


if __name__ == "__main__":
    main()
