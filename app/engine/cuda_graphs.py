"""CUDA graphs for decode-only steps: at small batches a decode step is mostly kernel-launch
overhead (hundreds of launches for a 32-layer model), which one graph replay removes.

The model runner (`ModelRunner.execute`) builds one at start-up on CUDA, which captures every
padded size then, and replays it for each step `can_run` accepts (decode-only, within the
buffers); other steps run the model eagerly. A replay gives the final hidden states and the
logits of every row in the model's dtype (the lm_head is in the graph too): in a decode-only
step every row is sampled, save a one-token prompt chunk now and then, for which the runner
takes the hidden states instead. Selection still runs eagerly after the replay.

Graphs are captured for padded batch sizes (1, 2, 4, 8, then every 16 up to the max) over
static input buffers. A step's rows are copied in; padding rows get slot -1 (their K/V are
written nowhere) and seq_len 0 (attention reads nothing and returns zeros). The block-table
buffer has `max_blocks_per_seq` columns: a sequence of exactly max_model_len tokens needs
ceil(max_model_len / block_size) of them, hence the +1 margin above. A graph cannot follow
the step's CPU-side max_seq_len, so the backend's decode grid is sized while capturing
(`static_decode`) for a *reach*: every size is captured twice when the model's longest
context needs more than one attention split, once for that longest context and once for
steps whose sequences all fit one split (the backend's `partition_size`). Those replay a
grid of one split per sequence with no merge kernel, the same numbers as the long grid.
"""

from __future__ import annotations

import torch

from kernels.attention_interface import AttentionMetadata


def capture_sizes(max_batch_size: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch_size]
    sizes += list(range(16, max_batch_size, 16))
    return sizes + [max_batch_size]


class CudaGraphDecodeRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], backend,
                 max_batch_size: int, max_blocks_per_seq: int, device: torch.device | str):
        self.model, self.kv_caches, self.backend = model, kv_caches, backend
        self.device = torch.device(device)
        assert self.device.type == "cuda", "CUDA graphs need a CUDA device"
        self.max_batch_size = max_batch_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_seq_len = max_blocks_per_seq * kv_caches[0].shape[2]
        self.sizes = capture_sizes(max_batch_size)
        n, dev = max_batch_size, self.device
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=dev)
        # One logits buffer for every graph ([256, 128k] bf16 is 66 MB; a graph's own output
        # per padded size and reach would hold over 1 GB).
        lm_head = model.lm_head.weight
        self.logits = torch.empty(n, lm_head.shape[0], dtype=lm_head.dtype, device=dev)
        one_split = getattr(backend, "partition_size", None)  # the longest context one split holds
        self.reaches = [self.max_seq_len]  # ascending
        if one_split is not None and one_split < self.max_seq_len:
            self.reaches.insert(0, one_split)
        # Keyed by (reach, padded size); each graph's final hidden states are its own output.
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.hidden: dict[tuple[int, int], torch.Tensor] = {}
        self._capture()

    def _meta(self, bs: int, reach: int) -> AttentionMetadata:
        """Views of the static buffers: what the captured kernels read at replay."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:bs + 1], seq_lens=self.seq_lens[:bs],
            context_lens=self.context_lens[:bs], block_tables=self.block_tables[:bs],
            slot_mapping=self.slot_mapping[:bs], query_lens_cpu=[1] * bs,
            seq_lens_cpu=[reach] * bs)

    def _forward(self, bs: int, reach: int) -> torch.Tensor:
        """The final hidden states; the logits go to the shared buffer."""
        hidden = self.model(self.input_ids[:bs], self.positions[:bs], self.kv_caches,
                            self._meta(bs, reach), self.backend)
        self.model.compute_logits(hidden, fp32=False, out=self.logits[:bs])
        return hidden

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        for reach in reversed(self.reaches):  # the longest first: its grid needs the most memory
            with self.backend.static_decode(reach):
                for bs in reversed(self.sizes):  # largest first; the others reuse its pool
                    self._forward(bs, reach)  # warm-up compiles the kernels; all rows are padding
                    torch.cuda.synchronize(self.device)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        self.hidden[reach, bs] = self._forward(bs, reach)
                    pool = graph.pool() if pool is None else pool
                    self.graphs[reach, bs] = graph
        torch.cuda.synchronize(self.device)

    def can_run(self, meta: AttentionMetadata) -> bool:
        n = meta.num_seqs
        return (0 < n <= self.max_batch_size and meta.is_decode_only
                and meta.block_tables.shape[1] <= self.max_blocks_per_seq
                and meta.max_seq_len <= self.max_seq_len)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Final hidden states [n, hidden] and logits [n, vocab] (model dtype) of the n decode
        rows: views of the graph's output buffers, overwritten by the next run (which the
        stream orders after every kernel already launched that reads them)."""
        n = meta.num_seqs
        bs = next(s for s in self.sizes if s >= n)
        reach = next(r for r in self.reaches if r >= meta.max_seq_len)
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.slot_mapping[n:bs].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.seq_lens[n:bs].zero_()
        self.context_lens[:n].copy_(meta.context_lens, non_blocking=True)
        # Columns past `width` keep stale ids: never read, as seq_len bounds every read.
        self.block_tables[:n, :width].copy_(meta.block_tables, non_blocking=True)
        self.graphs[reach, bs].replay()
        return self.hidden[reach, bs][:n], self.logits[:n]
