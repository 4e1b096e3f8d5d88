"""The distribution a sampled row draws from: temperature, then top-k, top-p and min-p.

Batched over rows on the logits' device. Only top-k and top-p need an order, so rows are
sorted (once, all together) only when some row asks for one; min-p is a threshold against
the row's maximum, which no cut changes. `row_probs` is the reference, and what verification
reads on a GPU; on the CPU verification and the draft model read `filtered_probs`, the same
distribution without the sort. A row's own token is drawn without it too (`draw.py`)."""

from __future__ import annotations

import numpy as np
import torch

from app.sampling_params import SamplingParams


def sort_descending(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of each row sorted largest first. On the CPU numpy's argsort (SIMD
    quicksort) is ~6x faster than torch's sort: 0.18 against 1.06 ms for the [5, 4096] fp32 rows
    of one request verifying 4 drafts. Ties come in either's arbitrary order."""
    if rows.device.type != "cpu":
        return rows.sort(dim=-1, descending=True)
    order = torch.from_numpy(np.argsort(np.negative(rows.detach().float().contiguous().numpy()), axis=-1))
    return rows.gather(-1, order), order


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside a row's top-k, then outside its top-p nucleus (of the
    top-k distribution), then below min_p x its most likely token's probability.
    top_k = 0 means no cut; rows are [N, V], settings [N]."""
    sorted_logits, order = sort_descending(logits)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, logits.shape[-1])[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), float("-inf"))
    sorted_logits = _cut_below_min_p(sorted_logits, min_p)
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def _cut_below_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """-inf where p < min_p x p_max, i.e. where logit < max + log(min_p) (min_p 0 cuts nothing)."""
    floor = logits.amax(dim=-1, keepdim=True) + min_p[:, None].log()
    return logits.masked_fill(logits < floor, float("-inf"))


def row_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
              top_p: torch.Tensor, min_p: torch.Tensor, needs_sort: bool) -> torch.Tensor:
    """fp32 probabilities per row. `needs_sort`: some row has top-k or top-p (known on the host,
    so a batch without them never sorts)."""
    rows = logits.float() / temperature[:, None]
    if needs_sort:
        rows = filter_logits(rows, top_k, top_p, min_p)
    else:
        rows = _cut_below_min_p(rows, min_p)
    return rows.softmax(dim=-1)


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor, min_p: torch.Tensor, needs_sort: bool) -> torch.Tensor:
    """`row_probs`, on the CPU in C++ without a sort where it builds and the logits are fp32
    (specserve_kernels/cpu/draw.cpp's filtered_probs: 15 against ~130 us for a row of 4,096 on one thread,
    2026-11-28). There ties at a top-k or top-p cut are all kept, as the draws keep them (the
    reference keeps an arbitrary order of them)."""
    ops = cpu_selection_ops(logits)
    if ops is None:
        return row_probs(logits, temperature, top_k, top_p, min_p, needs_sort)
    return ops.filtered_probs(logits.contiguous(), temperature.float().contiguous(), top_k.long().contiguous(),
                              top_p.float().contiguous(), min_p.float().contiguous())


def cpu_selection_ops(logits: torch.Tensor):
    """specserve_kernels/cpu's selection ops (specserve_kernels/cpu/draw.cpp) for these logits: for fp32 logits on
    the CPU where the ops build; else None (the torch steps)."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return None
    from specserve_kernels.cpu import cpu_ops
    return cpu_ops()


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from, settings given per row."""
    dev = logits.device
    return filtered_probs(logits, torch.tensor([p.temperature for p in params], device=dev),
                          torch.tensor([p.top_k for p in params], device=dev),
                          torch.tensor([p.top_p for p in params], device=dev),
                          torch.tensor([p.min_p for p in params], device=dev),
                          any(p.top_k > 0 or p.top_p < 1 for p in params))
