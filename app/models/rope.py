"""Rotary position embedding: the frequencies and cos/sin, computed as transformers does so fp32
outputs match exactly (the rotation itself is specserve_kernels/torch_rotary.py)."""

from __future__ import annotations

import math

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """On the CPU, as transformers computes them, even where the model is built on the meta
    device (arithmetic there goes through torch._refs, whose first use imports torch._dynamo)."""
    positions = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu")
    inv_freq = 1.0 / (theta ** (positions.float() / head_dim))
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"rope scaling type {kind!r} is not supported (default, linear, llama3)")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling: long wavelengths slowed by `factor`, short ones
    kept, a smooth blend between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, theta: float, scaling: dict | None):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)
        self.table: torch.Tensor | None = None  # [positions, 2, head_dim]: cos, sin (`tabulate`)

    def tabulate(self, max_positions: int, dtype: torch.dtype) -> None:
        """Compute cos/sin once for positions [0, max_positions) in `dtype`; a step then gathers
        its rows, one kernel where computing them took eight on CUDA (about 12 us of a batch-1
        decode step on an H100, 2026-11-27). For CUDA only: there each element's cos is the
        same function wherever it sits, so a row of the table is what `cos_sin` computes, bit
        for bit; the CPU's vectorised cos may differ from its scalar one in the last bit."""
        cos, sin = self._computed(torch.arange(max_positions, device=self.inv_freq.device), dtype)
        self.table = torch.stack((cos, sin), dim=1)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, head_dim] each, the two halves equal, for `positions` [T]."""
        if self.table is not None and self.table.dtype == dtype:
            rows = self.table.index_select(0, positions)
            return rows[:, 0], rows[:, 1]
        return self._computed(positions, dtype)

    def _computed(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)
