"""The CPU attention backend: the PyTorch backend, with every sequence that has a few query
tokens (decodes, and 1 + k speculative verification rows) computed by the C++ paged kernel
in place in the cache, instead of through a gathered, padded copy of it. Prompt chunks (many
query tokens: compute-bound) stay with PyTorch's fused attention.

The copy was what kept the CPU path behind vLLM's: the gather read and wrote every cached K/V
once more per layer and step (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import torch

from specserve_kernels.attention_interface import AttentionMetadata
from specserve_kernels.torch_attention import SHORT_QUERY_MAX, TorchAttentionBackend, attend_sequence


class CpuAttentionBackend(TorchAttentionBackend):
    name = "cpu"

    def __init__(self, short_query_kernel):
        """`short_query_kernel`: `specserve_kernels.cpu.paged_attention_short()`."""
        super().__init__()
        self.short_query_kernel = short_query_kernel
        self._plan: tuple[AttentionMetadata, torch.Tensor, list[int], list[int]] | None = None

    def _plan_for(self, meta: AttentionMetadata) -> tuple[torch.Tensor, list[int], list[int]]:
        """(sequences for the kernel, the others, query starts), worked out once per step: every
        layer attends with the same metadata."""
        if self._plan is None or self._plan[0] is not meta:
            short, long = [], []
            for i, q_len in enumerate(meta.query_lens_cpu):
                if q_len:
                    (short if q_len <= SHORT_QUERY_MAX else long).append(i)
            starts = meta.query_start_loc.tolist() if long else []
            self._plan = (meta, torch.tensor(short, dtype=torch.long), long, starts)
        return self._plan[1:]

    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float) -> torch.Tensor:
        if query.dtype != torch.float32 or kv_cache.dtype != torch.float32:
            return super().attend(query, kv_cache, meta, scale)
        short, long, starts = self._plan_for(meta)
        query = query.contiguous()
        out = torch.empty_like(query)
        if short.numel():
            self.short_query_kernel(query, kv_cache, meta.block_tables, meta.query_start_loc,
                                    meta.seq_lens, short, scale, out)
        for i in long:
            attend_sequence(query, kv_cache, meta, scale, i, starts[i], out)
        return out
