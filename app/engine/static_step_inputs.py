"""The buffers a captured CUDA-graph step reads, filled for each replay in one copy.

Every buffer is a view of one device byte buffer, laid out as a pinned host buffer is, so a
step's inputs cross in a single host-to-device copy instead of one per array plus the fills of
the padding (about fifteen launches before each replay). The block tables come last and only
the step's own rows are copied, each as wide as the graph's reach needs (64 columns for
sequences that fit one attention split, against 514 at a context of 8,192). There are two host
buffers, used in turn, and each waits for its previous copy before it is written again: with
overlapped scheduling the host fills the next step's while the copy of the last may still be
queued behind the step running.

A plain decode step's draws cross in the same copy: per sequence its temperature (0: greedy),
top-p, min-p and the uniforms the host computed (`GraphDraws`).

Padding: a step's rows are at the front of the padded shape; the other tokens have slot -1
(their K/V are written nowhere) and token id and position 0, the other sequences seq_len 0
(decode attention reads nothing) and no query tokens (query_start_loc repeats the step's token
count, so the prefill kernel's programs for them exit at once).
"""

from __future__ import annotations

import torch

from app.engine.selection.draws import DRAW_ROUNDS
from app.engine.step_inputs import DeviceInputs, GraphDraws, StepArrays
from specserve_kernels.attention_interface import AttentionMetadata


class StaticStepInputs:
    def __init__(self, max_seqs: int, max_tokens: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device | str):
        self.device = torch.device(device)
        self.max_seqs, self.max_blocks_per_seq, self.block_size = max_seqs, max_blocks_per_seq, block_size
        fields = [("input_ids", torch.int64, max_tokens),
                  ("from_source", torch.int64, max_tokens),  # index into the in-flight tokens, or -1
                  ("positions", torch.int64, max_tokens), ("slot_mapping", torch.int64, max_tokens),
                  ("seq_lens", torch.int32, max_seqs), ("context_lens", torch.int32, max_seqs),
                  ("query_start_loc", torch.int32, max_seqs + 1),
                  # a plain step's draws (GraphDraws), one row per sequence
                  ("temperature", torch.float32, max_seqs), ("top_p", torch.float32, max_seqs),
                  ("min_p", torch.float32, max_seqs), ("uniforms", torch.float64, max_seqs * DRAW_ROUNDS),
                  ("block_tables", torch.int32, max_seqs * max_blocks_per_seq)]  # last: copied by rows
        self.offsets: dict[str, tuple[int, torch.dtype, int]] = {}
        nbytes = 0
        for name, dtype, count in fields:
            self.offsets[name] = (nbytes, dtype, count)
            nbytes += -(-count * dtype.itemsize // 8) * 8  # every field 8-byte aligned
        self.device_buffer = torch.zeros(nbytes, dtype=torch.uint8, device=self.device)
        views = self._views(self.device_buffer)
        self.input_ids, self.from_source, self.positions = views["input_ids"], views["from_source"], views["positions"]
        self.slot_mapping, self.seq_lens = views["slot_mapping"], views["seq_lens"]
        self.context_lens, self.query_start_loc = views["context_lens"], views["query_start_loc"]
        self.temperature, self.top_p, self.min_p = views["temperature"], views["top_p"], views["min_p"]
        self.uniforms = views["uniforms"].view(max_seqs, DRAW_ROUNDS)
        self.block_table_space = views["block_tables"]
        i32 = dict(dtype=torch.int32, device=self.device)
        self.one_query_each = torch.arange(max_seqs + 1, **i32)  # a plain decode step's starts
        on_cuda = self.device.type == "cuda"
        self.host_buffers = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=on_cuda) for _ in range(2)]
        self.host_views = [{name: view.numpy() for name, view in self._views(buffer).items()}
                           for buffer in self.host_buffers]
        self.copied = [torch.cuda.Event() if on_cuda else None for _ in range(2)]
        self.turn = 0

    def _views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: buffer[offset:offset + count * dtype.itemsize].view(dtype)
                for name, (offset, dtype, count) in self.offsets.items()}

    def block_table_columns(self, reach: int) -> int:
        """The block-table columns a step that reaches `reach` tokens reads."""
        return min(self.max_blocks_per_seq, -(-reach // self.block_size))

    def block_tables(self, seqs: int, reach: int) -> torch.Tensor:
        """[seqs, block_table_columns(reach)]: rows as narrow as the reach, so a step of short
        sequences copies its rows' few columns, not the longest context's."""
        columns = self.block_table_columns(reach)
        return self.block_table_space[:seqs * columns].view(seqs, columns)

    def meta(self, seqs: int, query_len: int, reach: int) -> AttentionMetadata:
        """Views of the buffers for a shape of `seqs` sequences of `query_len` query tokens that
        reach `reach` tokens of context: what the captured kernels read at replay."""
        starts = self.one_query_each if query_len == 1 else self.query_start_loc
        return AttentionMetadata(
            query_start_loc=starts[:seqs + 1], seq_lens=self.seq_lens[:seqs],
            context_lens=self.context_lens[:seqs], block_tables=self.block_tables(seqs, reach),
            slot_mapping=self.slot_mapping[:seqs * query_len], query_lens_cpu=[query_len] * seqs,
            seq_lens_cpu=[reach] * seqs)

    def load(self, step: StepArrays, device_inputs: DeviceInputs | None, draws: GraphDraws | None,
             seqs: int, query_len: int, reach: int) -> None:
        """Write the step's rows, padded to the shape, into the next host buffer and start its
        copy to the device. Without `draws` every sequence has temperature 0: the graph takes
        the argmax, and its draw kernel reads no logits."""
        turn, self.turn = self.turn, 1 - self.turn
        if self.copied[turn] is not None:
            self.copied[turn].synchronize()  # its last copy has run (at once, but for a race)
        host = self.host_views[turn]
        n, tokens, padded = step.num_seqs, step.num_tokens, seqs * query_len
        for name, values, pad in (("input_ids", step.input_ids, 0), ("positions", step.positions, 0),
                                  ("slot_mapping", step.slot_mapping, -1)):
            host[name][:tokens] = values
            host[name][tokens:padded] = pad
        host["from_source"][:padded] = -1
        if device_inputs is not None:
            host["from_source"][device_inputs.rows] = device_inputs.indices
        for name in ("seq_lens", "context_lens"):
            host[name][:n] = getattr(step, name)
            host[name][n:seqs] = 0
        if query_len > 1:
            host["query_start_loc"][:n + 1] = step.query_start_loc
            host["query_start_loc"][n + 1:seqs + 1] = tokens
        drawn = 0 if draws is None else len(draws.temperature)
        if drawn:
            host["temperature"][:drawn] = draws.temperature
            host["top_p"][:drawn] = draws.top_p
            host["min_p"][:drawn] = draws.min_p
            host["uniforms"][:drawn * DRAW_ROUNDS] = draws.uniforms.reshape(-1)
        host["temperature"][drawn:seqs] = 0.0
        # Columns past the step's width keep stale ids: never read, as seq_len bounds every read
        # (and a row's blocks past the reach, allocated ahead, are not read either).
        columns = self.block_table_columns(reach)
        width = min(step.block_tables.shape[1], columns)
        host["block_tables"][:seqs * columns].reshape(seqs, columns)[:n, :width] = step.block_tables[:, :width]
        offset, dtype, _ = self.offsets["block_tables"]
        nbytes = offset + n * columns * dtype.itemsize
        self.device_buffer[:nbytes].copy_(self.host_buffers[turn][:nbytes], non_blocking=True)
        if self.copied[turn] is not None:
            self.copied[turn].record()

    def token_ids(self, tokens: int, source: torch.Tensor) -> torch.Tensor:
        """The input ids of the first `tokens` rows: the in-flight rows' from `source`, on the
        device (ops a graph captures)."""
        from_source = self.from_source[:tokens]
        in_flight = source.index_select(0, from_source.clamp(min=0))
        return torch.where(from_source >= 0, in_flight, self.input_ids[:tokens])

