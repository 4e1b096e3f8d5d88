"""CUDA graphs for decode steps, plain and verifying: at small batches a decode step is mostly
kernel-launch overhead (hundreds of launches for a 32-layer model), which one graph replay
removes. A verifying step (1 + k query tokens per sequence) run eagerly cost about six plain
steps of the tiny pair on an H100, so drafts could never pay there (RESULTS.md, 2026-11-26).

The model runner (`ModelRunner.execute`) builds one at start-up on CUDA, which captures every
shape then, and replays it for each step `can_run` accepts; other steps run the model eagerly.
A replay gives the final hidden states and the logits of every token row in the model's dtype
(the lm_head is in the graph too): in a decode step every row is sampled, save a short prompt
chunk now and then, for which the runner takes the hidden states instead. A draft's tails are
the exception: only each sequence's last row is sampled, and the runner computes those rows'
logits from the hidden states, so their graphs leave the lm_head out (it would be a second
pass over the lm_head's weights, for nothing).
Selection still runs eagerly after the replay.

Shapes: padded sequence counts (1, 2, 4, 8, then every 16 up to the max) times a query length,
over static input buffers (`StaticStepInputs`). Plain decode steps (one query token per
sequence) are captured up to `max_num_seqs`. Steps of several query tokens per sequence are
captured at one query length for the batch sizes the speculation schedule drafts at
(`MultiTokenSteps`): a target's verifying steps (1 + the largest k), a draft model's uncached
tails. A step with fewer tokens per sequence (fewer drafts, a prompt chunk that short) replays
the same graph with its rows at the front and padding behind.

Attention: the prefill kernel, which verifying steps use, sizes its grid by sequences and query
length alone. The decode kernel's grid follows the longest context, which a graph cannot read
from the step, so it is sized while capturing (`static_decode`) for a *reach*: every plain size
is captured twice when the model's longest context needs more than one attention split, once
for that longest context and once for steps whose sequences all fit one split (the backend's
`partition_size`). Those replay a grid of one split per sequence with no merge kernel, the same
numbers as the long grid. The block-table buffer has `max_blocks_per_seq` columns: a sequence of
exactly max_model_len tokens needs ceil(max_model_len / block_size) of them, hence the +1 margin
the runner gives.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kernels.attention_interface import AttentionMetadata

logger = logging.getLogger(__name__)


def capture_sizes(max_batch_size: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch_size]
    sizes += list(range(16, max_batch_size, 16))
    return sizes + [max_batch_size]


@dataclass(frozen=True)
class MultiTokenSteps:
    """Steps of up to `max_seqs` sequences with up to `query_len` query tokens each, captured
    beside the plain decode steps. `every_row_sampled`: the graph computes every row's logits
    (verification); otherwise the hidden states only (a draft's tails)."""
    query_len: int
    max_seqs: int
    every_row_sampled: bool = True


class StaticStepInputs:
    """The buffers a captured step reads. A step's rows are copied to the front; the rest of
    the padded shape is padding: its tokens have slot -1 (their K/V are written nowhere), its
    sequences seq_len 0 (decode attention reads nothing) and no query tokens (query_start_loc
    repeats the step's token count, so the prefill kernel's programs for them exit at once)."""

    def __init__(self, max_seqs: int, max_tokens: int, max_blocks_per_seq: int, device: torch.device):
        i32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_seqs, **i32)
        self.context_lens = torch.zeros(max_seqs, **i32)
        self.query_start_loc = torch.zeros(max_seqs + 1, **i32)
        self.one_query_each = torch.arange(max_seqs + 1, **i32)  # a plain decode step's starts
        self.block_tables = torch.zeros(max_seqs, max_blocks_per_seq, **i32)

    def meta(self, seqs: int, query_len: int, reach: int) -> AttentionMetadata:
        """Views of the buffers for a shape of `seqs` sequences of `query_len` query tokens that
        reach `reach` tokens of context: what the captured kernels read at replay."""
        starts = self.one_query_each if query_len == 1 else self.query_start_loc
        return AttentionMetadata(
            query_start_loc=starts[:seqs + 1], seq_lens=self.seq_lens[:seqs],
            context_lens=self.context_lens[:seqs], block_tables=self.block_tables[:seqs],
            slot_mapping=self.slot_mapping[:seqs * query_len], query_lens_cpu=[query_len] * seqs,
            seq_lens_cpu=[reach] * seqs)

    def load(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
             seqs: int, query_len: int) -> int:
        """Copy a step's rows in, padded to the shape; returns the step's token count."""
        n, tokens = meta.num_seqs, input_ids.shape[0]
        self.input_ids[:tokens].copy_(input_ids, non_blocking=True)
        self.positions[:tokens].copy_(positions, non_blocking=True)
        self.slot_mapping[:tokens].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[tokens:seqs * query_len].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[n:seqs].zero_()
        self.context_lens[:n].copy_(meta.context_lens, non_blocking=True)
        if query_len > 1:
            self.query_start_loc[:n + 1].copy_(meta.query_start_loc, non_blocking=True)
            self.query_start_loc[n + 1:seqs + 1].fill_(tokens)
        # Columns past `width` keep stale ids: never read, as seq_len bounds every read.
        width = meta.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        return tokens


class CudaGraphDecodeRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], backend,
                 max_batch_size: int, max_blocks_per_seq: int, device: torch.device | str,
                 multi_token: MultiTokenSteps | None = None):
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.device = torch.device(device)
        assert self.device.type == "cuda", "CUDA graphs need a CUDA device"
        self.max_batch_size = max_batch_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_seq_len = max_blocks_per_seq * kv_caches[0].shape[2]
        self.sizes = capture_sizes(max_batch_size)
        several = multi_token is not None and multi_token.query_len > 1 and multi_token.max_seqs > 0
        self.multi_token_len = multi_token.query_len if several else 1
        self.multi_token_sizes = capture_sizes(min(multi_token.max_seqs, max_batch_size)) if several else []
        self.multi_token_logits = several and multi_token.every_row_sampled
        max_tokens = max([max_batch_size] + [s * self.multi_token_len for s in self.multi_token_sizes])
        max_logits_rows = max_tokens if self.multi_token_logits else max_batch_size
        self.inputs = StaticStepInputs(max_batch_size, max_tokens, max_blocks_per_seq, self.device)
        # One logits buffer for every graph ([256, 128k] bf16 is 66 MB; a graph's own output
        # per shape would hold over 1 GB).
        lm_head = model.lm_head.weight
        self.logits = torch.empty(max_logits_rows, lm_head.shape[0], dtype=lm_head.dtype, device=self.device)
        one_split = getattr(backend, "partition_size", None)  # the longest context one split holds
        self.reaches = [self.max_seq_len]  # ascending
        if one_split is not None and one_split < self.max_seq_len:
            self.reaches.insert(0, one_split)
        # Keyed by (reach, padded sequences, query length); each graph's final hidden states
        # are its own output.
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.hidden: dict[tuple[int, int, int], torch.Tensor] = {}
        started = time.perf_counter()
        self._capture()
        self.capture_s = time.perf_counter() - started  # start-up cost, printed by decode.py
        logger.info("captured %d CUDA graphs (%d plain sizes x reaches %s, %d sizes of %d query "
                    "tokens) in %.1f s", len(self.graphs), len(self.sizes), self.reaches,
                    len(self.multi_token_sizes), self.multi_token_len, self.capture_s)

    def _forward(self, seqs: int, query_len: int, reach: int) -> torch.Tensor:
        """The final hidden states; the logits, where the shape has them, go to the shared buffer."""
        tokens = seqs * query_len
        hidden = self.model(self.inputs.input_ids[:tokens], self.inputs.positions[:tokens], self.kv_caches,
                            self.inputs.meta(seqs, query_len, reach), self.backend)
        if self._has_logits(query_len):
            self.model.compute_logits(hidden, fp32=False, out=self.logits[:tokens])
        return hidden

    def _has_logits(self, query_len: int) -> bool:
        return query_len == 1 or self.multi_token_logits

    @torch.inference_mode()
    def _capture(self) -> None:
        shapes = [(reach, seqs, 1) for reach in reversed(self.reaches) for seqs in reversed(self.sizes)]
        # The prefill kernel's grid does not follow the context: one reach serves every step.
        shapes += [(self.max_seq_len, seqs, self.multi_token_len) for seqs in reversed(self.multi_token_sizes)]
        pool = None
        for reach, seqs, query_len in shapes:  # the largest first; the others reuse its pool
            with self.backend.static_decode(reach):
                self._forward(seqs, query_len, reach)  # warm-up compiles the kernels; all rows are padding
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.hidden[reach, seqs, query_len] = self._forward(seqs, query_len, reach)
            pool = graph.pool() if pool is None else pool
            self.graphs[reach, seqs, query_len] = graph
        torch.cuda.synchronize(self.device)

    def can_run(self, meta: AttentionMetadata) -> bool:
        n, query_len = meta.num_seqs, meta.max_query_len
        if not (n > 0 and meta.block_tables.shape[1] <= self.max_blocks_per_seq
                and meta.max_seq_len <= self.max_seq_len):
            return False
        if query_len == 1:
            return n <= self.max_batch_size
        return bool(self.multi_token_sizes) and query_len <= self.multi_token_len and n <= self.multi_token_sizes[-1]

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final hidden states [T, hidden] and logits [T, vocab] (model dtype; None for a
        draft's tails) of the step's T token rows: views of the graph's output buffers,
        overwritten by the next run (which the stream orders after every kernel already
        launched that reads them)."""
        n = meta.num_seqs
        if meta.max_query_len == 1:
            seqs, query_len = next(s for s in self.sizes if s >= n), 1
            reach = next(r for r in self.reaches if r >= meta.max_seq_len)
        else:
            seqs, query_len = next(s for s in self.multi_token_sizes if s >= n), self.multi_token_len
            reach = self.max_seq_len
        tokens = self.inputs.load(input_ids, positions, meta, seqs, query_len)
        self.graphs[reach, seqs, query_len].replay()
        logits = self.logits[:tokens] if self._has_logits(query_len) else None
        return self.hidden[reach, seqs, query_len][:tokens], logits
