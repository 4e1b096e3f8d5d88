"""The CPU attention paths against dense causal attention on each sequence's own contiguous K/V:
the PyTorch one (specserve_kernels/torch_attention.py: decode rows batched and not, short queries
with grouped matmuls, prompt chunks with scaled_dot_product_attention) and the C++ kernel's
backend (specserve_kernels/cpu: decode and verify rows in place in the cache)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specserve_kernels.attention_interface import AttentionMetadata
from specserve_kernels.torch_attention import paged_attention, write_kv_cache
from specserve_kernels.cpu.backend import CpuAttentionBackend
from tests.cpu_kernels import require_cpu_kernels

BLOCK = 16


def dense_reference(q, k, v, scale):
    """q [q_len, h, d], k/v [s, kvh, d]; query i sits at position s - q_len + i."""
    q_len, s = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1).transpose(0, 1) for x in (k, v))
    mask = torch.arange(s - q_len, s)[:, None] >= torch.arange(s)[None, :]
    return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, scale=scale).transpose(0, 1)


def attend(path: str, query, cache, meta, scale):
    if path == "cpu kernel":
        return CpuAttentionBackend(require_cpu_kernels().paged_attention_short).attend(query, cache, meta, scale)
    return paged_attention(query, cache, meta, scale, batch_decodes=path == "batched decodes")


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (10, 2)])
@pytest.mark.parametrize("path", ["batched decodes", "per sequence", "cpu kernel"])
def test_paged_attention_matches_dense(heads, kv_heads, path):
    g = torch.Generator().manual_seed(heads * 7 + kv_heads)
    dim, scale = 16, 16 ** -0.5
    # (query tokens, tokens before them): decodes of several lengths, a 1+k verify, prompt
    # chunks after a cached prefix and from the start.
    shapes = [(1, 0), (1, 15), (1, 16), (1, 40), (5, 18), (16, 33), (17, 3), (40, 100), (20, 0)]
    num_blocks = sum(-(-(q + c) // BLOCK) for q, c in shapes) + 4
    cache = torch.zeros(2, num_blocks, BLOCK, kv_heads, dim)
    tables, query, slots, expected, next_block = [], [], [], [], 1  # block 0 unused
    for q_len, ctx in shapes:
        seq = q_len + ctx
        blocks = list(range(next_block, next_block + -(-seq // BLOCK)))
        next_block += len(blocks)
        tables.append(blocks + [0] * (10 - len(blocks)))
        k = torch.randn(seq, kv_heads, dim, generator=g)
        v = torch.randn(seq, kv_heads, dim, generator=g)
        pos = torch.arange(seq)
        seq_slots = torch.tensor(blocks)[pos // BLOCK] * BLOCK + pos % BLOCK
        write_kv_cache(k, v, cache, seq_slots)
        q = torch.randn(q_len, heads, dim, generator=g)
        query.append(q)
        slots.append(seq_slots[ctx:])
        expected.append(dense_reference(q, k, v, scale))
    q_lens = [q for q, _ in shapes]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32),
        seq_lens=torch.tensor([q + c for q, c in shapes], dtype=torch.int32),
        context_lens=torch.tensor([c for _, c in shapes], dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.cat(slots),
        query_lens_cpu=q_lens,
        seq_lens_cpu=[q + c for q, c in shapes])
    out = attend(path, torch.cat(query), cache, meta, scale)
    torch.testing.assert_close(out, torch.cat(expected), atol=2e-5, rtol=1e-4)
