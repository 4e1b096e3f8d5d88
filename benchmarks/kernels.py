"""Attention-kernel bandwidth on the GPU, beside the card's own device-to-device copy.

Decode attention is memory-bound: its floor is reading every sequence's K and V once, so the
figure of merit is bytes read per second over what a plain `copy_` achieves on the same card
(goal >= 80% at batch 64 x 4k context, Llama-3-8B's attention shape, bf16). The PyTorch
reference runs in the same process for the ratio.

    python benchmarks/kernels.py [--batch 64] [--context 4096] [--partition 256 512] [--block-n 32 64]

The defaults in kernels/decode_attention.py (partition 256, block_n 32) were chosen without
a GPU; the sweep shows whether another pair is faster on the card at hand.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def time_cuda(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median seconds per call, by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth(gib: float = 2.0) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_cuda(lambda: dst.copy_(src), iters=10)
    return 2 * src.numel() / seconds


def decode_case(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                block_size: int, dtype: torch.dtype):
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq + 1
    kv = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device="cuda")
    perm = torch.randperm(num_blocks - 1, device="cuda")[:batch * blocks_per_seq] + 1
    tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    query = torch.randn(batch, heads, head_dim, dtype=dtype, device="cuda")
    return query, kv, tables, seq_lens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--partition", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--block-n", type=int, nargs="+", default=[32, 64])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py measures GPU kernels and needs CUDA; no GPU here, nothing run.")
        return 0

    from app.engine.attention_metadata import AttentionMetadata
    from app.engine.torch_attention import paged_attention
    from kernels.decode_attention import decode_attention

    print(f"device: {torch.cuda.get_device_name()}")
    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s")
    dtype = torch.bfloat16
    query, kv, tables, seq_lens = decode_case(args.batch, args.context, args.heads, args.kv_heads,
                                              args.head_dim, args.block_size, dtype)
    kv_bytes = 2 * args.batch * args.context * args.kv_heads * args.head_dim * kv.element_size()
    io_bytes = 2 * query.numel() * query.element_size() + tables.numel() * 4
    scale = args.head_dim ** -0.5
    print(f"decode attention, batch {args.batch} x context {args.context}, heads "
          f"{args.heads}/{args.kv_heads} x {args.head_dim}, bf16, block {args.block_size}: "
          f"K+V = {kv_bytes / 2**20:.0f} MiB")
    for partition in args.partition:
        for block_n in args.block_n:
            seconds = time_cuda(lambda: decode_attention(
                query, kv[0], kv[1], tables, seq_lens, scale, args.context,
                partition_size=partition, block_n=block_n))
            bw = (kv_bytes + io_bytes) / seconds
            print(f"  triton, partition {partition:5d}, block_n {block_n:3d}: {seconds * 1e6:8.1f} us"
                  f"  {bw / 1e9:7.0f} GB/s  {100 * bw / copy_bw:5.1f}% of copy")
    meta = AttentionMetadata(
        query_start_loc=torch.arange(args.batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=seq_lens, context_lens=seq_lens - 1, block_tables=tables,
        slot_mapping=torch.full((args.batch,), -1, dtype=torch.int64, device="cuda"),
        query_lens_cpu=[1] * args.batch, seq_lens_cpu=[args.context] * args.batch)
    seconds = time_cuda(lambda: paged_attention(query, kv, meta, scale), iters=5)
    bw = (kv_bytes + io_bytes) / seconds
    print(f"  torch reference (gather + SDPA): {seconds * 1e6:8.1f} us  {bw / 1e9:7.0f} GB/s  "
          f"{100 * bw / copy_bw:5.1f}% of copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
