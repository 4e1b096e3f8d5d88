"""Plain-PyTorch attention over the paged KV cache: the CPU path and the reference the
Triton kernels are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specserve_kernels.attention_interface import AttentionMetadata

DECODE_GROUP_SIZE = 16
SHORT_QUERY_MAX = 16  # one sequence's speculative verification (1 + k tokens)


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Store the step's K/V [T, kv_heads, head_dim] at their slots; slot -1 is padding."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])
    flat[0].index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first seq_len cached K and V of one sequence, each [seq_len, kv_heads, head_dim]."""
    block_size = kv_cache.shape[2]
    blocks = block_table[:-(-seq_len // block_size)].long()
    k, v = (cache.index_select(0, blocks).flatten(0, 1)[:seq_len] for cache in kv_cache)
    return k, v


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, batch_decodes: bool = True) -> torch.Tensor:
    """Causal attention of the new tokens [T, heads, head_dim] against each sequence's cache.

    Query i of a sequence sits at position context_len + i and sees keys 0..context_len + i.
    With `batch_decodes`, single-token rows are done together in one padded call (fast, but
    it reads padding slots under a mask, so they must hold finite values); otherwise every
    sequence reads exactly its own tokens, which is what kernel tests with NaN-filled unused
    blocks compare against.
    """
    out = torch.empty_like(query)
    starts = meta.query_start_loc.tolist()
    decode_rows = [i for i, q_len in enumerate(meta.query_lens_cpu) if q_len == 1]
    if batch_decodes and len(decode_rows) > 1:
        # Groups of similar length, so that little of each padded gather is padding.
        decode_rows.sort(key=lambda i: meta.seq_lens_cpu[i])
        for g in range(0, len(decode_rows), DECODE_GROUP_SIZE):
            group = decode_rows[g:g + DECODE_GROUP_SIZE]
            _decode_attention(query, kv_cache, meta, scale, group, [starts[i] for i in group], out)
        decode_rows = set(decode_rows)
    else:
        decode_rows = set()
    for i, q_len in enumerate(meta.query_lens_cpu):
        if q_len and i not in decode_rows:
            attend_sequence(query, kv_cache, meta, scale, i, starts[i], out)
    return out


def attend_sequence(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, i: int, start: int, out: torch.Tensor) -> None:
    """Sequence i's rows of `out` (its query rows start at `start`), reading exactly its own
    cached tokens."""
    q_len, seq_len = meta.query_lens_cpu[i], meta.seq_lens_cpu[i]
    q = query[start:start + q_len].transpose(0, 1)  # [h, q, d]
    k, v = gather_kv(kv_cache, meta.block_tables[i], seq_len)
    k, v = k.transpose(0, 1).to(q.dtype), v.transpose(0, 1).to(q.dtype)  # [kvh, s, d]
    if q_len <= SHORT_QUERY_MAX:
        mask = None
        if q_len > 1:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
            mask = q_pos >= torch.arange(seq_len, device=q.device)[None, :]
        o = short_query_attention(q, k, v, mask, scale)
    else:
        o = prompt_attention(q, k, v, scale)
    out[start:start + q_len] = o.transpose(0, 1)


def prompt_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of one sequence's last q_len positions: q [heads, q_len, d], k and v
    [kv_heads, seq_len, d]. Given a batch axis, SDPA takes its fused (flash) CPU kernel, 2.5-3x
    faster here than the 3-D call (benchmarks/RESULTS.md); is_causal where no prefix is cached."""
    q_len, seq_len = q.shape[1], k.shape[1]
    mask = None
    if q_len != seq_len:  # the queries sit after a cached prefix: causal from the bottom right
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        mask = q_pos >= torch.arange(seq_len, device=q.device)[None, :]
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale,
                                          is_causal=mask is None,
                                          enable_gqa=q.shape[0] != k.shape[0])[0]


def _decode_attention(query, kv_cache, meta, scale, rows: list[int], token_rows: list[int],
                      out: torch.Tensor) -> None:
    """One query token per sequence: gather every sequence's blocks into a padded batch and
    mask the padding, so the whole decode batch is one attention call."""
    seq_lens = [meta.seq_lens_cpu[i] for i in rows]
    block_size = kv_cache.shape[2]
    width = -(-max(seq_lens) // block_size)
    blocks = meta.block_tables[rows, :width].flatten().long()
    # index_select on each of K and V (contiguous) is several times faster than advanced
    # indexing of both at once on the CPU.
    k, v = (cache.index_select(0, blocks).view(len(rows), width * block_size, *cache.shape[2:])
            .transpose(1, 2).to(query.dtype) for cache in kv_cache)  # [B, kvh, L, d]
    lens = torch.tensor(seq_lens, device=query.device)
    # Padding slots hold stale or zero values (finite: the cache starts zeroed), which the mask
    # gives exactly zero weight.
    mask = torch.arange(k.shape[2], device=query.device)[None, :] < lens[:, None]  # [B, L]
    # The query heads that share a KV head are that head's query rows (all see the same keys),
    # so SDPA's fused CPU kernel runs per KV head: 1.5x faster than enable_gqa at 16 x 500, and
    # 2-3x faster than short_query_attention on a padded batch (benchmarks/RESULTS.md).
    num_rows, heads, dim = len(rows), query.shape[1], query.shape[2]
    q = query[token_rows].view(num_rows, k.shape[1], heads // k.shape[1], dim)  # [B, kvh, group, d]
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=scale)
    out[token_rows] = o.reshape(num_rows, heads, dim)


def short_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale) v for a few query tokens: q [..., heads, q, d], k and v
    [..., kv_heads, s, d], mask broadcastable to [..., heads, q, s]. The query heads that share
    a KV head become rows of one matmul; for one sequence's 1 + k verify rows on a CPU these two
    matmuls take a third to a half of scaled_dot_product_attention's time. A padded decode
    batch is the opposite (there SDPA's fused kernel wins 2-3x), so it is not used there."""
    *lead, heads, q_len, dim = q.shape
    kv_heads, keys = k.shape[-3], k.shape[-2]
    group = heads // kv_heads
    grouped = q.reshape(*lead, kv_heads, group * q_len, dim)
    scores = torch.matmul(grouped, k.transpose(-1, -2)).float() * scale
    if mask is not None:
        scores = scores.view(*lead, kv_heads, group, q_len, keys)
        if mask.dim() >= 3:  # split its heads axis like the scores'
            mask = mask.unflatten(-3, (kv_heads, group) if mask.shape[-3] == heads else (1, 1))
        scores = scores.masked_fill(~mask, float("-inf")).view(*lead, kv_heads, group * q_len, keys)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).view(*lead, heads, q_len, dim)


class TorchAttentionBackend:
    """Backend interface: `write_kv` then `attend`, once per layer per step."""

    name = "torch"

    def __init__(self, batch_decodes: bool = True):
        self.batch_decodes = batch_decodes

    def write_kv(self, key, value, kv_cache, meta: AttentionMetadata) -> None:
        write_kv_cache(key, value, kv_cache, meta.slot_mapping)

    def attend(self, query, kv_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return paged_attention(query, kv_cache, meta, scale, self.batch_decodes)
