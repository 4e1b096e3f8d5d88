"""Paged decode attention: one query token per sequence against its paged KV cache.

Layout: one program per (sequence, KV head, split). The query heads that share a KV head
(GQA group) are the rows of one tile, padded to >= 16 rows, so QK^T and PV are `tl.dot`s and
each K/V tile is read once per group rather than once per query head.

Split-K (flash-decoding): a sequence's context is cut into splits of a FIXED `partition_size`
tokens, so how a sequence is summed depends on its own length only, never on the batch it is
in. Each split writes its normalised partial output and log-sum-exp; a merge kernel combines
the splits that exist (empty ones are never read). A sequence with one split gets its output
from the split kernel directly (bitwise the same as a one-split merge), which the merge then
skips: under a CUDA graph the grid is sized for the longest context, yet short sequences
write and read no partials. With one split for every sequence the merge is not launched.

Tuning knobs (benchmarks/kernels.py sweeps them on a GPU; the defaults are the code's
original choices): `num_warps`/`num_stages`; `head_major`, a grid whose fastest axis is the
KV head, so programs that run side by side read neighbouring 256-byte rows of the same cache
pages instead of pages of different sequences; and `dots`:
  "fp32": K and V tiles cast to fp32, tf32 dots (exact QK^T for 16-bit inputs, P kept at tf32);
  "qk16": QK^T on the 16-bit K tile as loaded (q rounded to the cache dtype: the same products
          when q already has it, as in the engine), P.V as "fp32": half the K registers;
  "16":   both dots on 16-bit tiles, P rounded to the cache dtype (FlashAttention's numerics).
For fp32 caches the three are the same.

Numerics: tiles are accumulated in fp32; an all-masked row keeps a running
max of -inf, which is replaced by 0 before `exp2` so -inf - -inf never makes a NaN; a sequence
of length 0 (a CUDA-graph padding row) gives zeros. Block index x stride is computed in int64.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

DEFAULT_PARTITION_SIZE = 256  # tokens per split; a constant so results ignore the batch
MERGE_CHUNK = 16  # splits the merge reduces at once (fixed for the same reason)
LOG2E = 1.4426950408889634
DOTS = ("fp32", "qk16", "16")


@triton.jit
def load_kv_tile_raw(cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                     stride_cb, stride_cs, stride_ch, BLOCK_SIZE: tl.constexpr):
    """K or V of tokens `tok` [BLOCK_N] of one KV head, through the block table, in the
    cache's dtype."""
    block = tl.load(table_ptr + tok // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    row = block * stride_cb + (tok % BLOCK_SIZE).to(tl.int64) * stride_cs + kv_head * stride_ch
    ptrs = cache_ptr + row[:, None] + offs_d[None, :]
    return tl.load(ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def load_kv_tile(cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                 stride_cb, stride_cs, stride_ch, BLOCK_SIZE: tl.constexpr):
    """The same tile as fp32 (what the prefill kernel reads)."""
    return load_kv_tile_raw(cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                            stride_cb, stride_cs, stride_ch, BLOCK_SIZE).to(tl.float32)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    group_size, head_dim,
    BLOCK_SIZE: tl.constexpr, PARTITION: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, DIRECT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HEAD_MAJOR: tl.constexpr, QK16: tl.constexpr,
    PV16: tl.constexpr,
):
    if HEAD_MAJOR:  # grid (kv_heads, splits, batch)
        kv_head = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
    else:  # grid (batch, kv_heads, splits)
        b = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1).to(tl.int64)
        split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * PARTITION
    if start < seq_len:  # splits past the end do nothing; the merge never reads them
        end = tl.minimum(start + PARTITION, seq_len)
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        g_mask = offs_g < group_size
        d_mask = offs_d < head_dim
        heads = kv_head * group_size + offs_g
        q_raw = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                        mask=g_mask[:, None] & d_mask[None, :], other=0.0)
        q = q_raw.to(tl.float32)
        q16 = q_raw.to(k_cache_ptr.dtype.element_ty)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        table_ptr = block_tables_ptr + b * stride_bt
        for tile in range(start, end, BLOCK_N):
            tok = tile + offs_n
            n_mask = tok < end
            k = load_kv_tile_raw(k_cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                                 stride_cb, stride_cs, stride_ch, BLOCK_SIZE)
            v = load_kv_tile_raw(v_cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                                 stride_cb, stride_cs, stride_ch, BLOCK_SIZE)
            # scaled after the dot: a 16-bit q stays exact in tf32; log2 units for exp2
            if QK16:
                s = tl.dot(q16, tl.trans(k)) * scale_log2
            else:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision=DOT_PRECISION) * scale_log2
            s = tl.where(n_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if PV16:
                pv = tl.dot(p.to(v.dtype), v)
            else:
                pv = tl.dot(p, v.to(tl.float32), input_precision=DOT_PRECISION)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        mask = g_mask[:, None] & d_mask[None, :]
        if DIRECT or seq_len <= PARTITION:  # the sequence's only split: its output
            out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
            tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=mask)
        else:  # (names of their own: a variable keeps one type across both branches)
            part_ptrs = (part_out_ptr + b * stride_pb + heads[:, None] * stride_ph
                         + split * stride_ps + offs_d[None, :])
            tl.store(part_ptrs, o, mask=mask)
            lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_i))
            tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=g_mask)


@triton.jit
def _decode_merge_kernel(
    part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    head_dim,
    PARTITION: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b)
    num_splits = tl.cdiv(seq_len, PARTITION)  # this sequence's splits only
    if num_splits != 1:  # one split wrote the output itself
        offs_s = tl.arange(0, CHUNK)
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < head_dim
        lse_ptr = part_lse_ptr + b * stride_lb + h * stride_lh
        o_ptr = part_out_ptr + b * stride_pb + h * stride_ph
        max_vec = tl.full([CHUNK], float("-inf"), tl.float32)
        for c in range(0, num_splits, CHUNK):
            lse = tl.load(lse_ptr + c + offs_s, mask=c + offs_s < num_splits, other=float("-inf"))
            max_vec = tl.maximum(max_vec, lse)
        lse_max = tl.max(max_vec, 0)
        lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
        w_vec = tl.zeros([CHUNK], tl.float32)
        acc = tl.zeros([CHUNK, BLOCK_D], tl.float32)
        for c in range(0, num_splits, CHUNK):
            s_mask = c + offs_s < num_splits
            lse = tl.load(lse_ptr + c + offs_s, mask=s_mask, other=float("-inf"))
            w = tl.where(s_mask, tl.exp2(lse - lse_max), 0.0)
            o = tl.load(o_ptr + (c + offs_s)[:, None] * stride_ps + offs_d[None, :],
                        mask=s_mask[:, None] & d_mask[None, :], other=0.0)
            w_vec += w
            acc += o * w[:, None]
        total = tl.sum(w_vec, 0)
        res = tl.sum(acc, 0) / tl.where(total == 0.0, 1.0, total)
        tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, res.to(out_ptr.dtype.element_ty),
                 mask=d_mask)


def default_block_n(dtype: torch.dtype, block_d: int) -> int:
    """Keys per tile. The K and V tiles are fp32 in registers; ptxas for sm_90 (head_dim 128,
    4 warps) spills at 64 keys for 16-bit inputs and at 32 for fp32 (its dots run on FMAs)."""
    keys = 32 if dtype != torch.float32 else 16
    return min(64, keys * max(1, 128 // block_d))


def num_splits(seq_len: int, partition_size: int = DEFAULT_PARTITION_SIZE) -> int:
    """Splits of one sequence: a function of its own length only."""
    return max(1, math.ceil(seq_len / partition_size))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 caches get exact fp32 dots (fp32 runs must match transformers). 16-bit q and K are
    exact in tf32, so QK^T loses nothing on tensor cores; P rounds to tf32's 10 mantissa bits,
    finer than the bf16 P of the usual flash kernels."""
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     max_seq_len: int, partition_size: int = DEFAULT_PARTITION_SIZE,
                     block_n: int | None = None, out: torch.Tensor | None = None,
                     num_warps: int = 4, num_stages: int | None = None, head_major: bool = False,
                     dots: str = "fp32") -> torch.Tensor:
    """query [B, heads, head_dim] -> [B, heads, head_dim].

    k_cache/v_cache [num_blocks, block_size, kv_heads, head_dim]; block_tables [B, W] int32;
    seq_lens [B] int32 (the new token included). `max_seq_len` is only an upper bound that
    sizes the grid (CUDA graphs pass the model's max length; unused splits exit at once).
    num_warps, num_stages, head_major and dots: see the module's docstring.
    """
    assert dots in DOTS, f"dots must be one of {DOTS}"
    batch, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert num_heads % num_kv_heads == 0 and k_cache.stride() == v_cache.stride()
    assert query.stride(-1) == 1 and k_cache.stride(-1) == 1 and block_tables.stride(-1) == 1
    group = num_heads // num_kv_heads
    out = torch.empty_like(query) if out is None else out
    if batch == 0:
        return out
    splits = num_splits(max_seq_len, partition_size)
    direct = splits == 1
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_n = block_n or min(default_block_n(k_cache.dtype, block_d), partition_size)
    if direct:
        part_out = part_lse = out  # unused
        p_strides, l_strides = (0, 0, 0), (0, 0)
    else:
        part_out = torch.empty(batch, num_heads, splits, head_dim, dtype=torch.float32,
                               device=query.device)
        part_lse = torch.empty(batch, num_heads, splits, dtype=torch.float32, device=query.device)
        p_strides, l_strides = part_out.stride()[:3], part_lse.stride()[:2]
    sixteen = k_cache.dtype in (torch.float16, torch.bfloat16)
    grid = (num_kv_heads, splits, batch) if head_major else (batch, num_kv_heads, splits)
    launch = dict(num_warps=num_warps) if num_stages is None else dict(num_warps=num_warps,
                                                                      num_stages=num_stages)
    _decode_split_kernel[grid](
        query, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse,
        scale * LOG2E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        *p_strides, *l_strides, group, head_dim,
        BLOCK_SIZE=block_size, PARTITION=partition_size, BLOCK_N=block_n,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, DIRECT=direct,
        DOT_PRECISION=dot_precision(k_cache.dtype), HEAD_MAJOR=head_major,
        QK16=sixteen and dots in ("qk16", "16"), PV16=sixteen and dots == "16", **launch,
    )
    if not direct:
        _decode_merge_kernel[(batch, num_heads)](
            part_out, part_lse, seq_lens, out, *p_strides, *l_strides,
            out.stride(0), out.stride(1), head_dim,
            PARTITION=partition_size, CHUNK=MERGE_CHUNK, BLOCK_D=block_d, num_warps=1,
        )
    return out
