"""Attention-kernel bandwidth on the GPU, beside the card's own device-to-device copy.

Decode attention is memory-bound: its floor is reading every sequence's K and V once, so the
figure of merit is bytes read per second over what a plain `copy_` achieves on the same card
(issue 17's goal: >= 85% at batch 64 x 4k context, Llama-3-8B's attention shape, bf16). The
PyTorch reference runs in the same process for the ratio. Our kernel is timed as the engine
runs it, many calls replayed from one CUDA graph (`time_in_graph`), so a small batch's figure
is the kernel's and not its Python launch's; up to 512 MiB of K+V, each call finds a cold L2.

    python benchmarks/decode_attention_sweep.py                      # the staged sweep below, ~100 configs
    python benchmarks/decode_attention_sweep.py --full               # the whole cross product (slow)
    python benchmarks/decode_attention_sweep.py --partition 512 --split 64 --dots 16 --num-warps 4 8 \
        --num-stages 2 3 --grid head seq --full       # a chosen cross product

Knobs of `specserve_kernels.decode_attention.decode_attention` (see its module docstring): partition
(tokens per program in the default grid), split (keys per split, the unit of the numerics,
and per tile: split / block_size pages per iteration; a power of two dividing the partition),
programs (one per partition, or one per split: the grid small batches get; the same bits),
merge (where states need merging: a merge kernel, or each sequence's last program; the same bits),
dots (fp32 / qk16 / 16: the tiles' dtype in the two dots), grid (seq-major as before, or
KV-head-major), num_warps, num_stages (none: Triton's default).

    python benchmarks/decode_attention_sweep.py --batch 1 --context 256 --partition 1024 --split 32 64 \
        --programs partition split --dots 16 --grid head --full   # batch 1

Staged sweep (default): stage 1 crosses partition x split x programs x dots x grid
at 4 warps and the default stages; stage 2 takes stage 1's best three and crosses num_warps x num_stages. Every
configuration's output is checked against the fp32-tile default's (bf16 tolerance) and a
mismatch is reported and never picked. The best configuration is printed as the
TritonAttentionBackend arguments that select it.
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


def time_in_graph(fn, calls: int = 20, rounds: int = 10, flush_l2: bool = True) -> float:
    """Median seconds per call, with `calls` calls captured in one CUDA graph, as the engine
    launches them: no Python launch cost between kernels (timed call by call, a batch-1 decode
    kernel measured 75-170 us, its launch rather than its work). With `flush_l2`, each call
    follows a write over twice the L2 (as a decode step's other layers would leave it), timed
    alone in a graph of its own and subtracted."""
    l2 = getattr(torch.cuda.get_device_properties(DEVICE), "L2_cache_size", 50 * 2**20)
    scratch = torch.empty(2 * l2 if flush_l2 else 0, dtype=torch.uint8, device=DEVICE)

    def replay_seconds(body) -> float:
        body()  # compiles and allocates before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                body()
        graph.replay()
        return time_cuda(graph.replay, iters=rounds, warmup=1)

    if not flush_l2:
        return replay_seconds(fn) / calls
    flushed = replay_seconds(lambda: (scratch.zero_(), fn()))
    return max(0.0, flushed - replay_seconds(scratch.zero_)) / calls


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
    kv = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=DEVICE)
    perm = torch.randperm(num_blocks - 1, device=DEVICE)[:batch * blocks_per_seq] + 1
    tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    query = torch.randn(batch, heads, head_dim, dtype=dtype, device=DEVICE)
    return query, kv, tables, seq_lens


DEVICE = "cuda"
DEFAULTS = dict(partition=[256, 512, 1024], split=[16, 32, 64], programs=["partition"], merge=["kernel"],
                dots=["fp32", "qk16", "16"],
                grid=["seq", "head"], num_warps=[2, 4, 8], num_stages=[0, 2, 3, 4])


def _config_name(c: dict) -> str:
    stages = c["num_stages"] or "default"
    merge = " merged by the last program" if c["merge"] == "last" else ""
    return (f"partition {c['partition']:5d} split {c['split']:4d} per {c['programs']:>9s}{merge} "
            f"dots {c['dots']:>4s} "
            f"grid {c['grid']:>4s} warps {c['num_warps']} stages {stages}")


def _cross(**axes) -> list[dict]:
    import itertools
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--partition", type=int, nargs="+", default=DEFAULTS["partition"])
    parser.add_argument("--split", type=int, nargs="+", default=DEFAULTS["split"])
    parser.add_argument("--programs", nargs="+", default=DEFAULTS["programs"], choices=["partition", "split"])
    parser.add_argument("--merge", nargs="+", default=DEFAULTS["merge"], choices=["kernel", "last"],
                        help="where states need merging: a merge kernel, or each sequence's last program")
    parser.add_argument("--dots", nargs="+", default=DEFAULTS["dots"], choices=["fp32", "qk16", "16"])
    parser.add_argument("--grid", nargs="+", default=DEFAULTS["grid"], choices=["seq", "head"])
    parser.add_argument("--num-warps", type=int, nargs="+", default=DEFAULTS["num_warps"])
    parser.add_argument("--num-stages", type=int, nargs="+", default=DEFAULTS["num_stages"],
                        help="0: Triton's default")
    parser.add_argument("--full", action="store_true", help="the whole cross product, not staged")
    parser.add_argument("--top", type=int, default=3, help="stage-1 configurations taken to stage 2")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/decode_attention_sweep.py measures GPU kernels and needs CUDA; no GPU here, nothing run.")
        return 0

    from specserve_kernels.attention_interface import AttentionMetadata
    from specserve_kernels.torch_attention import paged_attention
    from specserve_kernels.decode_attention import decode_attention

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {__import__('triton').__version__}")
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

    def call(c: dict) -> torch.Tensor:
        return decode_attention(query, kv[0], kv[1], tables, seq_lens, scale, args.context,
                                partition_size=c["partition"], split_size=c["split"],
                                program_per_split=c["programs"] == "split", merge_by_last_program=c["merge"] == "last",
                                num_warps=c["num_warps"], num_stages=c["num_stages"] or None,
                                head_major=c["grid"] == "head", dots=c["dots"])

    reference = decode_attention(query, kv[0], kv[1], tables, seq_lens, scale, args.context).float()
    results: dict[str, tuple[float, dict]] = {}

    def measure(c: dict) -> None:
        name = _config_name(c)
        if name in results or c["partition"] % c["split"]:
            return
        try:
            out = call(c).float()
            wrong = not torch.allclose(out, reference, atol=3e-2, rtol=3e-2)
            seconds = time_in_graph(lambda: call(c), calls=args.iters,
                                    flush_l2=kv_bytes < 2**29)  # K+V 20x the L2 and more leaves it cold
        except Exception as exc:  # e.g. out of shared memory or registers for this tile
            print(f"  {name}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})")
            return
        bw = (kv_bytes + io_bytes) / seconds
        frac = bw / copy_bw
        print(f"  {name}: {seconds * 1e6:8.1f} us  {bw / 1e9:6.0f} GB/s  {100 * frac:5.1f}% of copy"
              + ("  WRONG (differs from the default's output)" if wrong else ""), flush=True)
        if not wrong:
            results[name] = (frac, c)

    axes = dict(partition=args.partition, split=args.split, programs=args.programs, merge=args.merge,
                dots=args.dots, grid=args.grid)
    if args.full:
        for c in _cross(**axes, num_warps=args.num_warps, num_stages=args.num_stages):
            measure(c)
    else:
        print("stage 1: partition x split x programs x dots x grid, 4 warps, default stages")
        for c in _cross(**axes, num_warps=[4], num_stages=[0]):
            measure(c)
        top = sorted(results.values(), key=lambda r: -r[0])[:args.top]
        print(f"stage 2: the best {len(top)} x num_warps x num_stages")
        for _, best in top:
            for c in _cross(num_warps=args.num_warps, num_stages=args.num_stages):
                measure({**best, **c})
    if results:
        frac, c = max(results.values(), key=lambda r: r[0])
        options = dict(num_warps=c["num_warps"], head_major=c["grid"] == "head", dots=c["dots"],
                       merge_by_last_program=c["merge"] == "last")
        if c["num_stages"]:
            options["num_stages"] = c["num_stages"]
        print(f"best: {_config_name(c)}: {100 * frac:.1f}% of copy\n"
              f"  TritonAttentionBackend(partition_size={c['partition']}, split_size={c['split']}, "
              f"decode_options={options})  (one program per {c['programs']})")
    meta = AttentionMetadata(
        query_start_loc=torch.arange(args.batch + 1, dtype=torch.int32, device=DEVICE),
        seq_lens=seq_lens, context_lens=seq_lens - 1, block_tables=tables,
        slot_mapping=torch.full((args.batch,), -1, dtype=torch.int64, device=DEVICE),
        query_lens_cpu=[1] * args.batch, seq_lens_cpu=[args.context] * args.batch)
    seconds = time_cuda(lambda: paged_attention(query, kv, meta, scale), iters=5)
    bw = (kv_bytes + io_bytes) / seconds
    print(f"  torch reference (gather + SDPA): {seconds * 1e6:8.1f} us  {bw / 1e9:7.0f} GB/s  "
          f"{100 * bw / copy_bw:5.1f}% of copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
