"""The distribution a sampled row draws from: temperature, then top-k, top-p and min-p.

Batched over rows on the logits' device. Only top-k and top-p need an order, so rows are
sorted (once, all together) only when some row asks for one; min-p is a threshold against
the row's maximum, which no cut changes. This is the reference, and what verification reads;
a row's own token is drawn without the sort (`draw.py`)."""

from __future__ import annotations

import torch

from app.sampling_params import SamplingParams


# On the CPU a sort of a 4096-token row costs ~0.2 ms and torch.topk of its 64 largest ~7 us:
# rows are sorted only as far as a cut can keep tokens, this many first, four times more until
# the prefix holds every row's nucleus, and whole when that reaches half the row.
PREFIX_START = 64


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside a row's top-k, then outside its top-p nucleus (of the
    top-k distribution), then below min_p x its most likely token's probability.
    top_k = 0 means no cut; rows are [N, V], settings [N]."""
    vocab = logits.shape[-1]
    sorted_logits, order = _sorted_prefix(logits, top_k, top_p)
    width = sorted_logits.shape[-1]
    rank = torch.arange(width, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    if width == vocab:
        probs = sorted_logits.softmax(dim=-1)
    else:  # normalised over the top-k distribution, which may reach past the prefix
        probs = (sorted_logits - _top_k_log_norm(logits, sorted_logits, k)).exp()
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), float("-inf"))
    sorted_logits = _cut_below_min_p(sorted_logits, min_p)
    filtered = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    if width == vocab:
        return filtered
    return torch.where(_has_cut(top_k, top_p, vocab)[:, None], filtered, _cut_below_min_p(logits, min_p))


def _has_cut(top_k: torch.Tensor, top_p: torch.Tensor, vocab: int) -> torch.Tensor:
    return ((top_k > 0) & (top_k < vocab)) | (top_p < 1)


def _top_k_log_norm(logits: torch.Tensor, prefix: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[N, 1] log of each row's top-k mass (every token's without top-k), from the prefix where
    the k largest fit in it."""
    return torch.where(k <= prefix.shape[-1], prefix.logsumexp(-1, keepdim=True),
                       logits.logsumexp(-1, keepdim=True))


def _sorted_prefix(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of each row's largest logits, in descending order: as many as hold
    every token that a row's top-k and top-p cuts can keep, or the whole row. On CUDA the whole
    row (a batched sort there is fast, and the search would sync with the host)."""
    vocab = logits.shape[-1]
    if logits.is_cuda:
        return logits.sort(dim=-1, descending=True)
    cut = _has_cut(top_k, top_p, vocab)
    largest_k = int(torch.where(top_k < vocab, top_k, 0).max()) if len(top_k) else 0
    width = max(PREFIX_START, largest_k)
    k = torch.where(top_k > 0, top_k, vocab)[:, None]
    while width < vocab // 2:
        values, indices = logits.topk(width, dim=-1)
        masked = values.masked_fill(torch.arange(width)[None, :] >= k, float("-inf"))
        held = (masked - _top_k_log_norm(logits, masked, k)).exp().sum(-1)
        if bool(((held >= top_p) | ~cut | (top_p >= 1)).all()):  # no kept token lies past the prefix
            return values, indices
        width *= 4
    return logits.sort(dim=-1, descending=True)


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


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from, settings given per row."""
    dev = logits.device
    return row_probs(logits, torch.tensor([p.temperature for p in params], device=dev),
                     torch.tensor([p.top_k for p in params], device=dev),
                     torch.tensor([p.top_p for p in params], device=dev),
                     torch.tensor([p.min_p for p in params], device=dev),
                     any(p.top_k > 0 or p.top_p < 1 for p in params))
