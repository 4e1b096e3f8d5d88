"""Store one step's K/V into their paged-cache slots (the Triton twin of
`specserve_kernels.torch_attention.write_kv_cache`, which is its reference).

One program per token writes all KV heads of that token; a negative slot marks a padding row
(CUDA-graph padding, or a token whose KV is not to be kept) and writes nothing. The slot is
split into (block, offset) and the block index is widened to int64 before it is multiplied by
the block stride, so a pool of more than 2^31 elements is addressed correctly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_cache_write_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, head (dim is 1)
    num_kv_heads, head_dim,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)
        src_k = key_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
        src_v = value_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
        dst = block * stride_cb + offset * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :]
        k = tl.load(src_k, mask=mask)
        v = tl.load(src_v, mask=mask)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """key/value [T, kv_heads, head_dim]; k_cache/v_cache [num_blocks, block_size, kv_heads,
    head_dim] (the two halves of a layer's cache); slot_mapping [T] int64, -1 = skip."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "head_dim must be contiguous"
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    _kv_cache_write_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        num_kv_heads, head_dim,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
