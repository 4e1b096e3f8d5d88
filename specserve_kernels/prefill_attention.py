"""Attention of new tokens against a cached prefix: prefill, chunked prefill, prefix-cache
extends and speculative verification (1 + k query tokens), in one flattened batch.

Sequence i owns query rows query_start_loc[i]:query_start_loc[i+1]; query j of it sits at
position context_lens[i] + j and sees keys 0..context_lens[i] + j, all read from the paged
cache (the step's K/V are written there first), so prefix and new tokens are one loop.

One program per (sequence, KV head, tile of BLOCK_Q queries). The rows of a tile are
(query, head-in-group) pairs: all query heads of a KV head share each K/V tile and a
speculative verify step with 5 query tokens still fills a 16+ row `tl.dot`. Numerics as in
decode: fp32 tiles and accumulators, guarded running max, int64 block offsets.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve_kernels.decode_attention import LOG2E, dot_precision, load_kv_tile


@triton.jit(do_not_specialize=["stride_bt"])  # the block tables' width: see _decode_split_kernel
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_ptr,
    context_lens_ptr,
    scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    group_size, head_dim,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    q_tile = tl.program_id(2)
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    if q_tile * BLOCK_Q < q_len:  # tiles past this sequence's queries do nothing
        context_len = tl.load(context_lens_ptr + b)
        rows = tl.arange(0, BLOCK_Q * BLOCK_G)
        qi = q_tile * BLOCK_Q + rows // BLOCK_G  # query index within the sequence
        g = rows % BLOCK_G
        row_mask = (qi < q_len) & (g < group_size)
        pos = context_len + qi  # absolute position: sees keys 0..pos
        heads = kv_head * group_size + g
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        d_mask = offs_d < head_dim
        token = (q_start + qi).to(tl.int64)
        q = tl.load(q_ptr + token[:, None] * stride_qt + heads[:, None] * stride_qh
                    + offs_d[None, :], mask=row_mask[:, None] & d_mask[None, :], other=0.0)
        q = q.to(tl.float32)
        m_i = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q * BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], tl.float32)
        kv_end = context_len + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)  # last row's pos + 1
        table_ptr = block_tables_ptr + b * stride_bt
        for tile in range(0, kv_end, BLOCK_N):
            tok = tile + offs_n
            n_mask = tok < kv_end
            k = load_kv_tile(k_cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                             stride_cb, stride_cs, stride_ch, BLOCK_SIZE)
            v = load_kv_tile(v_cache_ptr, table_ptr, tok, n_mask, kv_head, offs_d, d_mask,
                             stride_cb, stride_cs, stride_ch, BLOCK_SIZE)
            # scaled after the dot: a 16-bit q stays exact in tf32; log2 units for exp2
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
            visible = n_mask[None, :] & (tok[None, :] <= pos[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
            m_i = m_new
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        ptrs = out_ptr + token[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def query_tile(group: int, max_query_len: int, target_rows: int = 64) -> tuple[int, int]:
    """(BLOCK_Q, BLOCK_G): about `target_rows` (query, head) rows per tile, at least 16 for
    `tl.dot`, and no more query slots than the longest query needs. A row's result does not
    depend on BLOCK_Q: keys past its position are masked and leave its sums unchanged."""
    block_g = triton.next_power_of_2(group)
    block_q = max(1, target_rows // block_g)
    block_q = min(block_q, triton.next_power_of_2(max(max_query_len, 1)))
    block_q = max(block_q, max(1, 16 // block_g))
    return block_q, block_g


def query_tile_lengths(target_rows: int = 64) -> list[int]:
    """One longest-query length (2 tokens or more) for each query tile `query_tile` can choose,
    whatever the group: each tile is a Triton compile of its own, which a start-up warm-up
    pays instead of the first request that meets it."""
    return [2 ** i for i in range(1, target_rows.bit_length())]


def prefill_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                      context_lens: torch.Tensor, scale: float, max_query_len: int,
                      block_n: int | None = None, target_rows: int = 64,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """query [T, heads, head_dim] (all sequences' new tokens back to back) -> [T, heads,
    head_dim]. Caches [num_blocks, block_size, kv_heads, head_dim] must already hold the new
    tokens' K/V. `max_query_len` (a CPU int) sizes the grid.

    Defaults (64 rows x 64 keys, 8 warps; 32 keys for fp32, whose dots run on FMAs) are the
    largest tiles ptxas for sm_90 compiles without spills at head_dim 128."""
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    assert num_heads % num_kv_heads == 0 and k_cache.stride() == v_cache.stride()
    assert query.stride(-1) == 1 and k_cache.stride(-1) == 1 and block_tables.stride(-1) == 1
    out = torch.empty_like(query) if out is None else out
    batch = query_start_loc.shape[0] - 1
    if num_tokens == 0 or batch == 0:
        return out
    group = num_heads // num_kv_heads
    block_q, block_g = query_tile(group, max_query_len, target_rows)
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_n = block_n or (32 if k_cache.dtype == torch.float32 else 64)
    grid = (batch, num_kv_heads, triton.cdiv(max_query_len, block_q))
    _prefill_kernel[grid](
        query, k_cache, v_cache, out, block_tables, query_start_loc, context_lens,
        scale * LOG2E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        group, head_dim,
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_G=block_g, BLOCK_N=block_n,
        BLOCK_D=block_d, DOT_PRECISION=dot_precision(k_cache.dtype),
        num_warps=8 if block_q * block_g * block_d >= 64 * 128 else 4,  # fp32 tiles: registers
    )
    return out
