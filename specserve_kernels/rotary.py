"""Rotary embedding applied in place to q and k in one kernel (eager PyTorch builds two
rotate-half copies per tensor). CUDA only; the reference is `specserve_kernels.torch_rotary.apply_rotary`.

cos/sin are [T, head_dim] as `RotaryEmbedding.cos_sin` returns them (the two halves equal);
the rotation is computed in fp32 and rounded once to the activation dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def load_cos_sin(cos_ptr, sin_ptr, t, stride_ct, stride_st, half, BLOCK_HALF: tl.constexpr):
    """Token t's cos and sin halves, in fp32."""
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    c1 = tl.load(cos_ptr + t * stride_ct + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + t * stride_ct + half + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + t * stride_st + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + t * stride_st + half + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    return c1, c2, s1, s2


@triton.jit
def rotate_in_place(x_ptr, stride_t, stride_h, t, num_heads, c1, c2, s1, s2, half,
            BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < half)
    ptr = x_ptr + t * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptr, (x1 * c1[None, :] - x2 * s1[None, :]).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr + half, (x2 * c2[None, :] + x1 * s2[None, :]).to(x_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_kt, stride_kh,
                   stride_ct, stride_st, num_q_heads, num_k_heads, half,
                   BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c1, c2, s1, s2 = load_cos_sin(cos_ptr, sin_ptr, t, stride_ct, stride_st, half, BLOCK_HALF)
    rotate_in_place(q_ptr, stride_qt, stride_qh, t, num_q_heads, c1, c2, s1, s2, half, BLOCK_HQ, BLOCK_HALF)
    rotate_in_place(k_ptr, stride_kt, stride_kh, t, num_k_heads, c1, c2, s1, s2, half, BLOCK_HK, BLOCK_HALF)


def apply_rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """q [T, heads, head_dim], k [T, kv_heads, head_dim], rotated in place; cos/sin [T, head_dim]."""
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos.stride(-1) == 1 and sin.stride(-1) == 1
    num_tokens, num_q_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
        sin.stride(0), num_q_heads, k.shape[1], half,
        BLOCK_HQ=triton.next_power_of_2(num_q_heads), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half))
