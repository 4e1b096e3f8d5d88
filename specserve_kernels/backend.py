"""The Triton attention backend: same interface as `TorchAttentionBackend` (write_kv, then
attend, once per layer per step), selected by the model runner on CUDA.

Decode-only steps (every sequence has exactly one query token) use the split-K decode kernel;
anything else (prefill, chunked prefill, prefix-cache extends, speculative verification,
mixed batches) uses the prefill kernel. Under CUDA-graph capture the decode grid must not
depend on the step's CPU-side max_seq_len: `static_max_seq_len` fixes it (see
`app.engine.cuda_graphs`); unused splits exit at once and the merge only reads a sequence's
own splits, so the numbers are the same either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import specserve_kernels.l2_prefetch as l2_prefetch  # its ENABLED read at each launch (ab_decode.py sets it)
from specserve_kernels.attention_interface import AttentionMetadata
from specserve_kernels.decode_attention import DEFAULT_PARTITION_SIZE, decode_attention
from specserve_kernels.kv_cache_write import _kv_cache_write_kernel, write_kv_cache
from specserve_kernels.prefill_attention import prefill_attention, query_tile_lengths


# Kernels were decorated under TRITON_INTERPRET=1 (CPU tests) or for the GPU.
INTERPRETED = type(_kv_cache_write_kernel).__name__ == "InterpretedFunction"


def _check_device(t: torch.Tensor) -> None:
    if t.device.type != "cuda" and not INTERPRETED:
        raise RuntimeError("the Triton attention backend needs CUDA tensors (or TRITON_INTERPRET=1 "
                           "set before `kernels` is imported); use attention_backend='torch'")


# The decode configuration that benchmarks/decode_attention_sweep.py picked on an H100 for bf16 (batch 64 x
# 4096 keys, 32/8 heads x 128, block 16, 2026-11-23: 83.2% of copy bandwidth against 77.8%
# for the defaults). Since a split became one tile (0184a70), splits of 64 keys with 2 stages
# beat 32 with 3 (2026-11-27: 73.2% of copy against 65.4% at 64 x 4096, 48.3% against 44.4% at
# 256 x 256). 16-bit P.V tiles, so it is used for 16-bit caches only.
TUNED_16BIT_DECODE = dict(partition_size=1024, split_size=64,
                          decode_options=dict(num_warps=4, num_stages=2, head_major=True, dots="16"))
SHORT_REACH = 256  # keys: a decode graph's shortest reach with a program per split


class TritonAttentionBackend:
    name = "triton"

    @classmethod
    def for_dtype(cls, dtype: torch.dtype) -> "TritonAttentionBackend":
        """The swept configuration for 16-bit caches, the defaults for fp32."""
        return cls(**TUNED_16BIT_DECODE) if dtype in (torch.bfloat16, torch.float16) else cls()

    def __init__(self, partition_size: int = DEFAULT_PARTITION_SIZE, split_size: int | None = None,
                 prefill_block_n: int | None = None, prefill_rows: int = 64,
                 decode_options: dict | None = None, program_per_split_up_to: int = 0):
        """split_size: keys per decode split and tile, the unit of its numerics (None: the
        kernel's default for the dtype). decode_options: num_warps, num_stages, head_major,
        dots, merge_by_last_program of `decode_attention` (what benchmarks/decode_attention_sweep.py
        sweeps); None keeps that function's defaults. program_per_split_up_to: decode steps of
        up to this many sequences take a program per split, larger ones a program per
        partition (the same bits; a CUDA graph's step counts its padded rows): a wide grid for
        small batches, which a partition grid leaves mostly idle, without the merge's cost at
        batches that fill the GPU."""
        self.partition_size = partition_size
        self.split_size = split_size
        self.decode_options = dict(decode_options or {})
        self.program_per_split_up_to = program_per_split_up_to
        self.prefill_block_n = prefill_block_n
        self.prefill_rows = prefill_rows
        self.static_max_seq_len: int | None = None

    def warm_up_shapes(self, max_model_len: int) -> list[tuple[int, int]]:
        """(query tokens, sequence length) of one sequence's steps that, run once, compile
        every variant of this backend's kernels an eager step can take: a prompt for each query
        tile of the prefill kernel (`query_tile_lengths`), a decode within one partition, and
        where a sequence can be longer, one across two (the split kernel's other ending, and
        the merge)."""
        prompts = [(n, n) for n in query_tile_lengths(self.prefill_rows) if n <= max_model_len]
        decodes = [(1, 1)] + ([(1, self.partition_size + 1)] if self.partition_size < max_model_len else [])
        return prompts + decodes

    def graph_reaches(self, max_seq_len: int) -> list[int]:
        """The contexts, ascending, that decode graphs are captured for: a step replays the
        shortest that holds its longest sequence, whose grid has a program for each partition
        (or split) of it; those past a sequence's end only exit. One partition (a program per
        sequence and KV head, no merge) and the longest; with a program per split, also
        SHORT_REACH: at batch 256 a reach of 1,024 keys in splits of 64 launches 16 programs a
        sequence and KV head, of which ~12 only exit at ~136 keys, each holding an SM's slot
        while it does."""
        reaches = {max_seq_len, min(self.partition_size, max_seq_len)}
        if self.program_per_split_up_to:
            reaches.add(min(SHORT_REACH, max_seq_len))
        return sorted(reaches)

    @contextlib.contextmanager
    def static_decode(self, max_seq_len: int) -> Iterator[None]:
        """Inside, decode grids are sized for `max_seq_len` whatever the step: for capture."""
        previous, self.static_max_seq_len = self.static_max_seq_len, max_seq_len
        try:
            yield
        finally:
            self.static_max_seq_len = previous

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None:
        _check_device(kv_cache)
        write_kv_cache(key, value, kv_cache[0], kv_cache[1], meta.slot_mapping)

    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float) -> torch.Tensor:
        """query [T, heads, head_dim] -> [T, heads, head_dim]."""
        _check_device(kv_cache)
        query = query if query.stride(-1) == 1 else query.contiguous()
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        if meta.is_decode_only:
            max_seq_len = self.static_max_seq_len or meta.max_seq_len
            return decode_attention(query, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                    scale, max_seq_len, self.partition_size, split_size=self.split_size,
                                    program_per_split=meta.num_seqs <= self.program_per_split_up_to,
                                    kv_evict_first=l2_prefetch.ENABLED, **self.decode_options)
        return prefill_attention(query, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                                 meta.context_lens, scale, meta.max_query_len,
                                 self.prefill_block_n, self.prefill_rows)
