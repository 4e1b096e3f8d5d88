"""What the engine and the attention backends agree on: the shape of one step's flattened batch
(`AttentionMetadata`) and the calls a backend answers (`AttentionBackend`). A leaf module: the
engine (app/) and the kernels (specserve_kernels/) import it, it imports neither."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class AttentionMetadata:
    """Query tokens of all requests lie back to back; request i owns rows
    query_start_loc[i]:query_start_loc[i+1] and attends to its first seq_lens[i] cached tokens
    (context_lens[i] of them computed in earlier steps, the rest written this step).

    KV cache of one layer: a tensor [2, num_blocks, block_size, num_kv_heads, head_dim].
    """

    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32, context after this step
    context_lens: torch.Tensor  # [B] int32, context before this step (cached prefix)
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32
    slot_mapping: torch.Tensor  # [T] int64, slot of each new token; -1 = padding, no write
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)

    @property
    def is_decode_only(self) -> bool:
        """One query token per sequence: a plain decode step."""
        return self.max_query_len == 1


class AttentionBackend(Protocol):
    """One implementation of paged attention: plain PyTorch (specserve_kernels/torch_attention.py), the
    CPU's C++ kernel (specserve_kernels/cpu/backend.py) or Triton on CUDA (specserve_kernels/backend.py)."""

    name: str

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        """Store this step's new K/V ([T, kv_heads, head_dim]) at `meta.slot_mapping`."""

    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float) -> torch.Tensor:
        """query [T, heads, head_dim] -> [T, heads, head_dim], each row over its sequence's cache."""
