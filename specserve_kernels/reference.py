"""PyTorch references for the kernels, and a builder of paged-attention cases for their tests.

Attention's reference is `specserve_kernels.torch_attention` (the engine's CPU path); RMSNorm's is
`app.models.llama.RMSNorm` and rotary's `specserve_kernels.torch_rotary.apply_rotary`, restated here only
to add the residual the fused kernel takes; the fused rotary + KV write's is rotary followed
by the engine's `write_kv_cache`; SiLU-and-multiply's is `app.models.llama.MLP`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specserve_kernels.attention_interface import AttentionMetadata
from specserve_kernels.torch_attention import paged_attention, write_kv_cache
from specserve_kernels.torch_rotary import apply_rotary


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None):
    """The model's RMSNorm; with `residual`, on h = x + residual, returning (norm(h), h)."""
    h = x if residual is None else x + residual
    hf = h.float()
    y = weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if residual is None else (y, h)


def rotary_ref(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def rotary_write_kv_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
                        ) -> torch.Tensor:
    """Rotated q; rotated k and v written into kv_cache [2, blocks, block_size, kvh, d]."""
    q, k = rotary_ref(q, k, cos, sin)
    write_kv_cache(k, v, kv_cache, slot_mapping)
    return q


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass
class PagedCase:
    """A batch of sequences with a random paged layout. Blocks no sequence owns, and the
    unused tail of each last block, hold NaN so a stray read shows up in the output."""

    query: torch.Tensor  # [T, heads, head_dim]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, kv_heads, head_dim]
    meta: AttentionMetadata


def make_meta(query_lens: list[int], context_lens: list[int], block_tables: torch.Tensor,
              block_size: int, device: torch.device | str = "cpu") -> AttentionMetadata:
    """Metadata as the model runner builds it; slots are those of the new tokens."""
    seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
    starts = [0]
    slots: list[int] = []
    for q, c, row in zip(query_lens, context_lens, block_tables.tolist()):
        starts.append(starts[-1] + q)
        slots += [row[p // block_size] * block_size + p % block_size for p in range(c, c + q)]
    i32 = dict(dtype=torch.int32, device=device)
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, **i32), seq_lens=torch.tensor(seq_lens, **i32),
        context_lens=torch.tensor(context_lens, **i32), block_tables=block_tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_lens_cpu=list(query_lens), seq_lens_cpu=seq_lens)


def make_paged_case(query_lens: list[int], context_lens: list[int], num_heads: int,
                    num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
                    seed: int = 0, spare_blocks: int = 3, device: str = "cpu") -> PagedCase:
    """Every position 0..seq_len-1 of every sequence is filled (prefix and new tokens alike);
    blocks are handed out in a shuffled order with spare ones between them."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
    needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(needed) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(needed) + 1
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    kv = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    for i, (n, s) in enumerate(zip(needed, seq_lens)):
        blocks = [order.pop() for _ in range(n)]
        tables[i, :n] = torch.tensor(blocks, dtype=torch.int32)
        for p in range(s):
            kv[:, blocks[p // block_size], p % block_size] = torch.randn(
                2, num_kv_heads, head_dim, generator=gen).to(dtype)
    if order:  # table padding points at a NaN block too
        for i, n in enumerate(needed):
            tables[i, n:] = order[0]
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(dtype)
    meta = make_meta(query_lens, context_lens, tables, block_size, device)
    return PagedCase(query.to(device), kv.to(device), meta)


def attention_ref(case: PagedCase, scale: float) -> torch.Tensor:
    """The engine's PyTorch attention in fp32 (the tolerance then covers only the kernel)."""
    return paged_attention(case.query.float(), case.kv_cache.float(), case.meta, scale,
                           batch_decodes=False)
