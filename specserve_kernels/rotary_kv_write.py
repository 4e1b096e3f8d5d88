"""Rotary embedding on q and k fused with the KV-cache write: one kernel per layer where
eager PyTorch runs about ten (rotate-half copies, multiplies, adds, the write). The reference
is `specserve_kernels.reference.rotary_write_kv_ref`: `specserve_kernels.torch_rotary.apply_rotary` on q and k, then
`specserve_kernels.torch_attention.write_kv_cache` of the rotated k and of v.

One program per token. q is rotated in place (it is a view of the qkv projection's output,
which nothing else reads); k is rotated on its way into the cache and v copied there, at the
token's slot in the layout `specserve_kernels.kv_cache_write` writes ([num_blocks, block_size,
kv_heads, head_dim] per half). A negative slot (padding) writes no K/V; its q is still
rotated. The rotation is computed in fp32 and rounded once to the activation dtype (then to
the cache's dtype, as the unfused write does). Programs after the tokens' may prefetch the
next weight (o_proj's) into L2 while attention runs (`specserve_kernels/l2_prefetch.py`). cos/sin are [T, head_dim] as
`RotaryEmbedding.cos_sin` returns them (the two halves equal), so the model's RoPE scaling
(linear, llama3) is already in them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve_kernels.dependent_launch import dependent_launch_args, wait_for_predecessor
from specserve_kernels.l2_prefetch import NO_PREFETCH, Prefetch, launch_args, prefetch_share
from specserve_kernels.rotary import load_cos_sin, rotate_in_place


@triton.jit(do_not_specialize=["num_tokens"])
def _rotary_kv_write_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct, stride_st,
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, head (dim is 1)
    num_q_heads, num_kv_heads, half, num_tokens, prefetch_ptr, prefetch_bytes,
    BLOCK_SIZE: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr, DEPENDENT_LAUNCH: tl.constexpr, PREFETCH_LANES: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    if PREFETCH_LANES:
        if t >= num_tokens:  # a program after the tokens': its share of the next weight, and done
            prefetch_share(prefetch_ptr, prefetch_bytes, t - num_tokens, tl.num_programs(0) - num_tokens,
                           PREFETCH_LANES)
            return
    wait_for_predecessor(DEPENDENT_LAUNCH)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    c1, c2, s1, s2 = load_cos_sin(cos_ptr, sin_ptr, t, stride_ct, stride_st, half, BLOCK_HALF)
    rotate_in_place(q_ptr, stride_qt, stride_qh, t, num_q_heads, c1, c2, s1, s2, half, BLOCK_HQ,
                    BLOCK_HALF)

    # k rotated and v copied, straight into the cache.
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        block = slot // BLOCK_SIZE
        base = block * stride_cb + (slot % BLOCK_SIZE) * stride_cs
        offs_hk = tl.arange(0, BLOCK_HK)
        k_mask = (offs_hk[:, None] < num_kv_heads) & d_mask[None, :]
        k1_ptr = k_ptr + t * stride_kt + offs_hk[:, None] * stride_kh + offs_d[None, :]
        k1 = tl.load(k1_ptr, mask=k_mask, other=0.0).to(tl.float32)
        k2 = tl.load(k1_ptr + half, mask=k_mask, other=0.0).to(tl.float32)
        r1 = (k1 * c1[None, :] - k2 * s1[None, :]).to(k_ptr.dtype.element_ty)
        r2 = (k2 * c2[None, :] + k1 * s2[None, :]).to(k_ptr.dtype.element_ty)
        cache_off = base + offs_hk[:, None] * stride_ch + offs_d[None, :]
        tl.store(k_cache_ptr + cache_off, r1.to(k_cache_ptr.dtype.element_ty), mask=k_mask)
        tl.store(k_cache_ptr + cache_off + half, r2.to(k_cache_ptr.dtype.element_ty), mask=k_mask)
        v1_ptr = v_ptr + t * stride_vt + offs_hk[:, None] * stride_vh + offs_d[None, :]
        v1 = tl.load(v1_ptr, mask=k_mask, other=0.0)
        v2 = tl.load(v1_ptr + half, mask=k_mask, other=0.0)
        tl.store(v_cache_ptr + cache_off, v1.to(v_cache_ptr.dtype.element_ty), mask=k_mask)
        tl.store(v_cache_ptr + cache_off + half, v2.to(v_cache_ptr.dtype.element_ty), mask=k_mask)


def rotary_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, prefetch: Prefetch = NO_PREFETCH) -> torch.Tensor:
    """q [T, heads, head_dim] rotated in place and returned; k and v [T, kv_heads, head_dim]
    (k rotated) stored at `slot_mapping` [T] (int64, -1 = no write) in k_cache/v_cache
    [num_blocks, block_size, kv_heads, head_dim]. k itself is left as it was. `prefetch`: the
    next weight's bytes to ask into L2 meanwhile (`specserve_kernels.l2_prefetch.prefetch_for`)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if num_tokens == 0:
        return q
    assert head_dim % 2 == 0 and k.shape[-1] == head_dim and v.shape == k.shape
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert cos.stride(-1) == 1 and sin.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    half = head_dim // 2
    prefetch_args, prefetch_lanes = launch_args(prefetch, q, num_warps=4)
    _rotary_kv_write_kernel[(num_tokens + prefetch.programs,)](
        q, k, v, cos, sin, slot_mapping, k_cache, v_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), sin.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        num_q_heads, num_kv_heads, half, num_tokens, *prefetch_args,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_HQ=triton.next_power_of_2(num_q_heads),
        BLOCK_HK=triton.next_power_of_2(num_kv_heads), BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=4, **prefetch_lanes, **dependent_launch_args(q.device))
    return q
