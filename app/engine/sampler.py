"""Token sampling for a batch of rows, each with its own settings.

Greedy rows take the argmax; the rest go through temperature, top-k, top-p and min-p, then
draw from their own generator when seeded (so their tokens do not depend on the batch)."""

from __future__ import annotations

import torch

from app.engine.request import Request
from app.outputs import TokenLogprob
from app.sampling_params import SamplingParams


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit outside a row's top-k, then outside its top-p nucleus (of the
    top-k distribution), then below min_p x its most likely token's probability.
    top_k = 0 means no cut; rows are [N, V], settings [N]."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, logits.shape[-1])[:, None]
    sorted_logits = sorted_logits.masked_fill(rank >= k, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    sorted_logits = sorted_logits.masked_fill(probs < min_p[:, None] * probs[:, :1], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from: temperature, then the filters."""
    rows = logits.float() / torch.tensor([p.temperature for p in params])[:, None]
    rows = filter_logits(rows, torch.tensor([p.top_k for p in params]),
                         torch.tensor([p.top_p for p in params]),
                         torch.tensor([p.min_p for p in params]))
    return rows.softmax(dim=-1)


def compute_logprobs(logits: torch.Tensor, token_ids: list[int], requests: list[Request]
                     ) -> list[TokenLogprob | None]:
    """Logprobs of the model's own distribution (before temperature and filters), as vLLM."""
    wanted = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    result: list[TokenLogprob | None] = [None] * len(requests)
    if not wanted:
        return result
    logprobs = logits[wanted].log_softmax(dim=-1)
    max_n = max(requests[i].params.logprobs for i in wanted)
    top_vals, top_ids = logprobs.topk(max(max_n, 1), dim=-1)
    for row, i in enumerate(wanted):
        n = requests[i].params.logprobs
        top = dict(zip(top_ids[row, :n].tolist(), top_vals[row, :n].tolist()))
        result[i] = TokenLogprob(token_ids[i], float(logprobs[row, token_ids[i]]), top)
    return result


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]
                 ) -> tuple[list[int], list[TokenLogprob | None]]:
        logits = logits.float()
        tokens = logits.argmax(dim=-1).cpu()
        sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
        if sampled:
            probs = sampling_probs(logits[sampled].cpu(), [requests[i].params for i in sampled])
            for row, i in enumerate(sampled):
                generator = requests[i].generator or self.generator
                tokens[i] = torch.multinomial(probs[row], 1, generator=generator).item()
        token_ids = tokens.tolist()
        return token_ids, compute_logprobs(logits, token_ids, requests)
