"""A scheduled step's inputs as the host builds them: numpy arrays, not yet on the device.

The model runner builds them once per step (`ModelRunner.prepare`). An eager step copies each
array to the device (`StepArrays.to_device`); a step that replays a CUDA graph writes them all
into one pinned staging buffer, which crosses in a single copy (`StaticStepInputs.load`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from app.engine.to_device import to_device
from specserve_kernels.attention_interface import AttentionMetadata


@dataclass
class DeviceInputs:
    """Input rows whose tokens a step still in flight is choosing: row `rows[i]` takes
    `source[indices[i]]`, read on the device where the step in flight leaves it."""
    rows: list[int]
    source: torch.Tensor  # the step in flight's final tokens, one per request it samples
    indices: list[int]


@dataclass
class GraphDraws:
    """How a plain decode step's CUDA graph chooses each sequence's token (one row each): its
    argmax where temperature is 0 (greedy), else a draw with these settings and uniforms."""
    temperature: np.ndarray  # float32 [n]
    top_p: np.ndarray  # float32 [n]
    min_p: np.ndarray  # float32 [n]
    uniforms: np.ndarray  # float64 [n, DRAW_ROUNDS]


@dataclass
class StepArrays:
    """T token rows of n sequences; int64 per token, int32 per sequence (the kernels' types)."""
    input_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T]
    slot_mapping: np.ndarray  # [T]
    query_start_loc: np.ndarray  # [n + 1]
    seq_lens: np.ndarray  # [n]
    context_lens: np.ndarray  # [n]
    block_tables: np.ndarray  # [n, the longest sequence's blocks]
    query_lens: list[int]
    seq_lens_list: list[int]
    sample_rows: list[int]  # the rows whose logits are needed

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_list, default=0)

    def to_device(self, device: torch.device, device_inputs: DeviceInputs | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Input ids (with the in-flight rows taken from the device), positions, metadata."""
        input_ids = to_device(self.input_ids, device)
        if device_inputs is not None:
            source = device_inputs.source
            input_ids.index_copy_(0, to_device(device_inputs.rows, device, torch.long),
                                  source.index_select(0, to_device(device_inputs.indices, source.device, torch.long)))
        meta = AttentionMetadata(
            query_start_loc=to_device(self.query_start_loc, device), seq_lens=to_device(self.seq_lens, device),
            context_lens=to_device(self.context_lens, device), block_tables=to_device(self.block_tables, device),
            slot_mapping=to_device(self.slot_mapping, device), query_lens_cpu=self.query_lens,
            seq_lens_cpu=self.seq_lens_list)
        return input_ids, to_device(self.positions, device), meta
