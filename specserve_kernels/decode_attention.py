"""Paged decode attention: one query token per sequence against its paged KV cache.

Layout: each program takes one (sequence, KV head) and a range of the sequence's keys. The
query heads that share a KV head (GQA group) are the rows of one tile, padded to >= 16 rows,
so QK^T and PV are `tl.dot`s and each K/V tile is read once per group rather than once per
query head.

How a sequence is summed depends on its own length only, never on the batch it is in, nor
on how many programs share the work (PITFALLS: a seeded request gives the same tokens alone
or in a batch). The context is cut into *splits* of a fixed `split_size` tokens, one tile
each, whose softmax is an unnormalised state (its max, mass and output). The splits of each
*partition* (`partition_size` tokens, a multiple) are folded left to right, then the
partitions are folded left to right, and the result is normalised once
(`specserve_kernels/softmax_states.py`'s `fold` does every fold, with the same operations wherever it
runs). A program walking many splits carries one state, as a plain online softmax does.
Splits of several tiles carry a second one: compiled
for sm_90 (`tests/triton_kernels/hopper_compile.py`), that kernel took 142-152 registers a
thread, 3 programs of 4 warps per SM, against 96-112 and 4-5 with a split per tile (80-116
before the splits). Registers did not decide the speed, though: the bf16 engine's splits of 64
keys at 2 stages take 154 and read faster on an H100 than 32 keys at 96 (specserve_kernels/backend.py),
more bytes in flight per program.

The work can be spread two ways, chosen by the caller; the bits are the same:
- one program per partition (the default, at every batch size): it folds its splits itself.
  Where the grid has one partition per sequence (the longest context fits one), each program
  writes its sequence's output and no merge is launched; otherwise every partition writes its
  state and a merge kernel folds them (short sequences too: one kernel with both endings took
  20 more registers a thread on sm_90, a quarter fewer programs per SM).
- one program per split (`program_per_split`; the backend's `program_per_split_up_to` says for
  which batch sizes, none by default): every split has a program,
  which writes its state, and the merge folds splits into partitions and partitions into the
  output. Meant for small batches, where a partition grid leaves most of the GPU idle (at
  batch 1, one program per KV head: 8 on an H100's 132 SMs, each walking its whole context).
  Taken by batch-1 decode steps where the longest context fitted one partition, it lost on an
  H100 (2026-11-27, Llama-3-8B shape, contexts 128-256, `benchmarks/ab_decode.py`): 161.2-161.3
  tok/s against 163.4-163.5 with the partition grid, 163.7 against 165.1-165.2 with dependent
  launch; the merge's launch costs more than the wider grid gains at such contexts. Longer
  contexts are not timed yet; being free to choose is what the fixed order of folds buys.
Either grid's states can be merged by a merge kernel or, with `merge_by_last_program`, by each
(sequence, KV head)'s last program to arrive (`specserve_kernels/arrival_counts.py`), with the same
folds (`softmax_states.merged`) and so the same bits: a kernel and a kernel boundary fewer a layer, which is
what the per-split grid paid for at batch 1 (the merge kernel took 3.0 us a layer in the
batch-1 trace of 2026-11-27). Off until a GPU times it (`benchmarks/ab_decode.py
--merge-by-last-program`).
Under a CUDA graph the grid is sized for the graph's reach (`max_seq_len`): splits past a
sequence's end exit at once and the merge reads a sequence's own splits only.

Tuning knobs (benchmarks/decode_attention_sweep.py sweeps them on a GPU; the defaults are the code's
original choices): `split_size`, which is also the tile (keys per iteration; it changes the
bits, so it is set once per model, never per batch); `num_warps`/`num_stages`; `head_major`,
a grid whose fastest axis is the
KV head, so programs that run side by side read neighbouring 256-byte rows of the same cache
pages instead of pages of different sequences; and `dots`:
  "fp32": K and V tiles cast to fp32, tf32 dots (exact QK^T for 16-bit inputs, P kept at tf32);
  "qk16": QK^T on the 16-bit K tile as loaded (q rounded to the cache dtype: the same products
          when q already has it, as in the engine), P.V as "fp32": half the K registers;
  "16":   both dots on 16-bit tiles, P rounded to the cache dtype (FlashAttention's numerics).
For fp32 caches the three are the same.

Numerics: states are folded in fp32 with explicit FMAs, so the compiler's contraction
choices cannot differ between the two grids; a split's max is finite (it holds at least one
key) and the empty state's -inf max gives a weight of exactly 0 when folded; a sequence of
length 0 (a CUDA-graph padding row) gives zeros, written by the merge or, with one partition,
by its own program. Block index x stride is computed in int64.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specserve_kernels.arrival_counts import arrival_counts
from specserve_kernels.dependent_launch import dependent_launch_args, wait_for_predecessor
from specserve_kernels.softmax_states import empty_state, fold, merged, store_output, store_state

DEFAULT_PARTITION_SIZE = 256  # tokens per partition (one program's keys in the default grid)
LOG2E = 1.4426950408889634
DOTS = ("fp32", "qk16", "16")


@triton.jit
def load_kv_tile_raw(cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                     stride_cb, stride_cs, stride_ch, BLOCK_SIZE: tl.constexpr, EVICTION: tl.constexpr = ""):
    """K or V of tokens `tok` [BLOCK_N] of one KV head, through the block table, in the
    cache's dtype. EVICTION: L2's policy for its lines ("evict_first": read once, and not to
    push out what is kept there)."""
    block = tl.load(table_ptr + tok // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    row = block * stride_cb + (tok % BLOCK_SIZE).to(tl.int64) * stride_cs + kv_head * stride_ch
    ptrs = cache_ptr + row[:, None] + offs_d[None, :]
    return tl.load(ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0, eviction_policy=EVICTION)


@triton.jit
def load_kv_tile(cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                 stride_cb, stride_cs, stride_ch, BLOCK_SIZE: tl.constexpr):
    """The same tile as fp32 (what the prefill kernel reads)."""
    return load_kv_tile_raw(cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                            stride_cb, stride_cs, stride_ch, BLOCK_SIZE).to(tl.float32)


@triton.jit
def _attend(q, q16, k_cache_ptr, v_cache_ptr, table_ptr, start, end, kv_head, offs_d,
            d_mask, scale_log2, stride_cb, stride_cs, stride_ch,
            BLOCK_SIZE: tl.constexpr, SPLIT: tl.constexpr, BLOCK_G: tl.constexpr,
            BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, QK16: tl.constexpr,
            PV16: tl.constexpr, KV_EVICTION: tl.constexpr):
    """Keys [start, end) (at least one; `start` on a split boundary), one split per tile: each
    split's softmax state folded in order into the state returned. Only that state is carried
    from tile to tile, as in a plain online softmax (registers, hence programs per SM, as
    before the splits); a single split comes out as its own state, since folding a state into
    the empty one gives that state bit for bit."""
    offs_n = tl.arange(0, SPLIT)
    m, l, acc = empty_state(BLOCK_G, BLOCK_D)
    for split_start in range(start, end, SPLIT):
        tok = split_start + offs_n
        n_mask = tok < end
        k = load_kv_tile_raw(k_cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                             stride_cb, stride_cs, stride_ch, BLOCK_SIZE, KV_EVICTION)
        v = load_kv_tile_raw(v_cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                             stride_cb, stride_cs, stride_ch, BLOCK_SIZE, KV_EVICTION)
        # scaled after the dot: a 16-bit q stays exact in tf32; log2 units for exp2
        if QK16:
            s = tl.dot(q16, tl.trans(k)) * scale_log2
        else:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=DOT_PRECISION) * scale_log2
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_split = tl.max(s, 1)  # finite: a split holds at least one key
        p = tl.exp2(s - m_split[:, None])
        if PV16:
            acc_split = tl.dot(p.to(v.dtype), v)
        else:
            acc_split = tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
        m, l, acc = fold(m, l, acc, m_split, tl.sum(p, 1), acc_split)
    return m, l, acc


# Counts that follow the step's shape (its block tables' width, its number of partitions) are
# not specialised on: each value Triton's JIT sets apart (1, multiples of 16) would be another
# compile, paid by the first eager step of that shape (hopper_compile.py --eager-variants).
@triton.jit(do_not_specialize=["stride_bt", "stride_lb", "stride_lh"])
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, arrivals_ptr,
    scale_log2,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    group_size, head_dim,
    BLOCK_SIZE: tl.constexpr, PARTITION: tl.constexpr, SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, DIRECT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HEAD_MAJOR: tl.constexpr, QK16: tl.constexpr, PV16: tl.constexpr,
    MERGE_LAST: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr, KV_EVICTION: tl.constexpr,
):
    wait_for_predecessor(DEPENDENT_LAUNCH)
    if HEAD_MAJOR:  # grid (kv_heads, units, batch)
        kv_head = tl.program_id(0).to(tl.int64)
        unit = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
    else:  # grid (batch, kv_heads, units)
        b = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1).to(tl.int64)
        unit = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    if PER_SPLIT:
        start = unit * SPLIT
        end = tl.minimum(start + SPLIT, seq_len)
    else:
        start = unit * PARTITION
        end = tl.minimum(start + PARTITION, seq_len)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < group_size
    d_mask = offs_d < head_dim
    heads = kv_head * group_size + offs_g
    if start < seq_len:  # units past the end do nothing; the merge never reads them
        q_raw = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                        mask=g_mask[:, None] & d_mask[None, :], other=0.0)
        q = q_raw.to(tl.float32)
        q16 = q_raw.to(k_cache_ptr.dtype.element_ty)
        m, l, acc = _attend(q, q16, k_cache_ptr, v_cache_ptr, block_tables_ptr + b * stride_bt, start, end,
                            kv_head, offs_d, d_mask, scale_log2, stride_cb, stride_cs, stride_ch, BLOCK_SIZE,
                            SPLIT, BLOCK_G, BLOCK_D, DOT_PRECISION, QK16, PV16, KV_EVICTION)
        if DIRECT:  # the sequence's only partition: its output
            # folded into the empty state first, as the merge folds every partition: the
            # same operations, so the same bits as a sequence the merge finishes
            m_out, l_out, acc_out = empty_state(BLOCK_G, BLOCK_D)
            m_out, l_out, acc_out = fold(m_out, l_out, acc_out, m, l, acc)
            store_output(l_out, acc_out, out_ptr, b, heads, offs_d, g_mask, d_mask, stride_ob, stride_oh)
        else:  # a split's or a partition's state, for the merge
            store_state(m, l, acc, part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, unit, offs_d, g_mask,
                        d_mask, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh)
            if MERGE_LAST:  # the sequence's last unit to arrive merges (specserve_kernels/arrival_counts.py)
                tl.debug_barrier()  # every thread's part of the state written before the count says so
                if HEAD_MAJOR:
                    count = arrivals_ptr + b * tl.num_programs(0) + kv_head
                else:
                    count = arrivals_ptr + b * tl.num_programs(1) + kv_head
                if PER_SPLIT:
                    units = tl.cdiv(seq_len, SPLIT)
                else:
                    units = tl.cdiv(seq_len, PARTITION)
                if tl.atomic_add(count, 1, sem="acq_rel") == units - 1:
                    l_out, acc_out = merged(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, seq_len, offs_d,
                                            g_mask, d_mask, stride_pb, stride_ph, stride_ps, stride_lb,
                                            stride_lh, PARTITION, SPLIT, PER_SPLIT, BLOCK_G, BLOCK_D, True)
                    tl.atomic_xchg(count, 0)
                    store_output(l_out, acc_out, out_ptr, b, heads, offs_d, g_mask, d_mask, stride_ob, stride_oh)
    elif (DIRECT or (MERGE_LAST and unit == 0)) and seq_len == 0:
        # a padding row, whose first program writes what the merge would: zeros
        m_out, l_out, acc_out = empty_state(BLOCK_G, BLOCK_D)
        store_output(l_out, acc_out, out_ptr, b, heads, offs_d, g_mask, d_mask, stride_ob, stride_oh)


@triton.jit(do_not_specialize=["stride_lb", "stride_lh"])
def _decode_merge_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, seq_lens_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    group_size, head_dim,
    PARTITION: tl.constexpr, SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr,
):
    """Folds the states the split kernel wrote (`merged`), one program per (sequence, KV head)."""
    wait_for_predecessor(DEPENDENT_LAUNCH)
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < group_size
    d_mask = offs_d < head_dim
    heads = kv_head * group_size + offs_g
    l, acc = merged(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, seq_len, offs_d, g_mask, d_mask,
                    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, PARTITION, SPLIT, PER_SPLIT,
                    BLOCK_G, BLOCK_D, False)
    store_output(l, acc, out_ptr, b, heads, offs_d, g_mask, d_mask, stride_ob, stride_oh)


def default_split_size(dtype: torch.dtype, block_d: int) -> int:
    """Keys per split (one tile). With fp32 K and V tiles in registers ("fp32" dots), ptxas for
    sm_90 (head_dim 128, 4 warps) spilled at 64 keys for 16-bit inputs and at 32 for fp32 (its
    dots run on FMAs)."""
    keys = 32 if dtype != torch.float32 else 16
    return min(64, keys * max(1, 128 // block_d))


def num_units(seq_len: int, size: int) -> int:
    """Partitions (or splits) of a sequence: a function of its own length only."""
    return max(1, math.ceil(seq_len / size))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 caches get exact fp32 dots (fp32 runs must match transformers). 16-bit q and K are
    exact in tf32, so QK^T loses nothing on tensor cores; P rounds to tf32's 10 mantissa bits,
    finer than the bf16 P of the usual flash kernels."""
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     max_seq_len: int, partition_size: int = DEFAULT_PARTITION_SIZE,
                     out: torch.Tensor | None = None,
                     num_warps: int = 4, num_stages: int | None = None, head_major: bool = False,
                     dots: str = "fp32", split_size: int | None = None,
                     program_per_split: bool = False, merge_by_last_program: bool = False,
                     kv_evict_first: bool = False) -> torch.Tensor:
    """query [B, heads, head_dim] -> [B, heads, head_dim].

    k_cache/v_cache [num_blocks, block_size, kv_heads, head_dim]; block_tables [B, W] int32;
    seq_lens [B] int32 (the new token included). `max_seq_len` is only an upper bound that
    sizes the grid (CUDA graphs pass their reach; unused programs exit at once).
    split_size (keys per split and per tile; default: `default_split_size`, at most the
    partition) divides partition_size. program_per_split: which grid (the module's docstring;
    the same bits either way). merge_by_last_program: where states need merging, the last
    program of each (sequence, KV head) merges them instead of a merge kernel (the same bits).
    kv_evict_first: K/V's lines marked first out of L2 (each is read once a step), so that the
    weights prefetched into it (`specserve_kernels/l2_prefetch.py`) stay there (the same bits).
    num_warps, num_stages, head_major and dots: see the module's docstring.
    """
    assert dots in DOTS, f"dots must be one of {DOTS}"
    batch, num_heads, head_dim = query.shape
    block_d = max(16, triton.next_power_of_2(head_dim))
    split_size = split_size or min(default_split_size(k_cache.dtype, block_d), partition_size)
    assert partition_size % split_size == 0, "a partition is a whole number of splits"
    assert split_size & (split_size - 1) == 0, "a split is one tile: a power of two keys"
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert num_heads % num_kv_heads == 0 and k_cache.stride() == v_cache.stride()
    assert query.stride(-1) == 1 and k_cache.stride(-1) == 1 and block_tables.stride(-1) == 1
    group = num_heads // num_kv_heads
    out = torch.empty_like(query) if out is None else out
    if batch == 0:
        return out
    partitions = num_units(max_seq_len, partition_size)
    units = num_units(max_seq_len, split_size) if program_per_split else partitions
    direct = units == 1 and not program_per_split
    if direct:
        part_acc = part_m = part_l = out  # unused
        p_strides, l_strides = (0, 0, 0), (0, 0)
    else:
        part_acc = torch.empty(batch, num_heads, units, head_dim, dtype=torch.float32, device=query.device)
        part_m = torch.empty(batch, num_heads, units, dtype=torch.float32, device=query.device)
        part_l = torch.empty_like(part_m)
        p_strides, l_strides = part_acc.stride()[:3], part_m.stride()[:2]
    sixteen = k_cache.dtype in (torch.float16, torch.bfloat16)
    grid = (num_kv_heads, units, batch) if head_major else (batch, num_kv_heads, units)
    launch = dict(num_warps=num_warps) if num_stages is None else dict(num_warps=num_warps,
                                                                      num_stages=num_stages)
    block_g = max(16, triton.next_power_of_2(group))
    dependent_launch = dependent_launch_args(query.device)
    merge_last = merge_by_last_program and not direct
    arrivals = arrival_counts(query.device, batch * num_kv_heads) if merge_last else seq_lens  # else unread
    _decode_split_kernel[grid](
        query, k_cache, v_cache, block_tables, seq_lens, out, part_acc, part_m, part_l, arrivals,
        scale * LOG2E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *p_strides, *l_strides, group, head_dim,
        BLOCK_SIZE=block_size, PARTITION=partition_size, SPLIT=split_size,
        PER_SPLIT=program_per_split, BLOCK_G=block_g, BLOCK_D=block_d,
        DIRECT=direct, DOT_PRECISION=dot_precision(k_cache.dtype), HEAD_MAJOR=head_major,
        QK16=sixteen and dots in ("qk16", "16"), PV16=sixteen and dots == "16", MERGE_LAST=merge_last,
        KV_EVICTION="evict_first" if kv_evict_first else "", **launch, **dependent_launch,
    )
    if not direct and not merge_last:
        _decode_merge_kernel[(batch, num_kv_heads)](
            part_acc, part_m, part_l, seq_lens, out, *p_strides, *l_strides,
            out.stride(0), out.stride(1), group, head_dim,
            PARTITION=partition_size, SPLIT=split_size, PER_SPLIT=program_per_split,
            BLOCK_G=block_g, BLOCK_D=block_d, num_warps=4, **dependent_launch,
        )
    return out
