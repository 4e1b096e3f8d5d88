"""Rejection sampling for speculative decoding, batched over a flattened layout: a front on the
engine's selection step (app/engine/selection/verify.py) for tests that hold distributions
rather than a step's layout (the engine calls `verify` through `Selector`).

Request i has k_i draft tokens and 1 + k_i target rows (its k_i verified positions plus the
bonus position). Greedy requests keep drafts while they equal the target argmax, so output is
identical to plain greedy decoding. Sampled requests accept a draft x with min(1, p(x)/q(x))
and resample a rejection from norm(max(0, p - q)); the emitted tokens then follow p exactly
(Leviathan et al. 2023). Proposers without a distribution (n-gram, greedy draft) give a point
mass q: accept with p(x), resample from p with x zeroed.

Randomness: each sampled request draws one key per call, from its own generator when it has
one, and its uniforms are keyed by (key, row), so a seeded request's tokens do not depend on
the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from app.engine.selection.draws import RowUniforms
from app.engine.selection.verify import VerifyRows, verify


@dataclass
class RejectionResult:
    token_ids: list[list[int]]  # per request: accepted drafts + one corrected/bonus token
    num_accepted: list[int]  # per request: how many drafts were accepted (0..k_i)


def _apply_mask(probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero disallowed tokens and renormalise. A row left with no mass (the filters removed
    every allowed token) falls back to uniform over the allowed tokens rather than NaN."""
    masked = probs * mask
    total = masked.sum(-1, keepdim=True)
    uniform = mask.float() / mask.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(total > 0, masked / total.clamp(min=1e-30), uniform)


def rejection_sample(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor | Sequence[int],
    num_draft_tokens: Sequence[int],
    is_greedy: Sequence[bool],
    draft_probs: torch.Tensor | None = None,
    has_draft_probs: Sequence[bool] | None = None,
    allowed_mask: torch.Tensor | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
    default_generator: torch.Generator | None = None,
) -> RejectionResult:
    """Verify the drafts of a batch of requests.

    target_probs: [sum(k_i + 1), V], request i's rows contiguous: the distribution it samples
        from (after temperature/top-k/top-p/min-p). For greedy requests only the argmax is
        used, so raw logits may be passed there.
    draft_token_ids: [sum(k_i)] flattened drafts; num_draft_tokens: k_i per request (0 is fine).
    draft_probs: [sum(k_i), V] the draft's full distribution at each draft position, or None.
    has_draft_probs: per request, whether its draft_probs rows are real; False (or
        draft_probs None) means a point-mass q. Ignored for greedy requests.
    allowed_mask: bool [sum(k_i + 1), V], e.g. a grammar mask, applied to p before anything.
    generators: per request, a generator for seeded requests (None: default_generator).
    """
    n = len(num_draft_tokens)
    if len(is_greedy) != n:
        raise ValueError("is_greedy must have one entry per request")
    if n == 0:
        return RejectionResult([], [])
    device = target_probs.device
    k = torch.tensor(num_draft_tokens, dtype=torch.long, device=device)
    if (k < 0).any():
        raise ValueError("num_draft_tokens must be >= 0")
    total_drafts = int(k.sum())
    drafts = torch.as_tensor(draft_token_ids, dtype=torch.long, device=device).reshape(-1)
    if drafts.numel() != total_drafts or target_probs.shape[0] != total_drafts + n:
        raise ValueError(f"expected {total_drafts} drafts and {total_drafts + n} target rows, got "
                         f"{drafts.numel()} and {target_probs.shape[0]}")
    if draft_probs is not None and draft_probs.shape != (total_drafts, target_probs.shape[1]):
        raise ValueError(f"draft_probs must be [{total_drafts}, V], got {tuple(draft_probs.shape)}")
    if allowed_mask is not None and allowed_mask.shape != target_probs.shape:
        raise ValueError("allowed_mask must have the shape of target_probs")
    for name, per_request in (("has_draft_probs", has_draft_probs), ("generators", generators)):
        if per_request is not None and len(per_request) != n:
            raise ValueError(f"{name} must have one entry per request")

    greedy = [bool(g) for g in is_greedy]
    has_q = [draft_probs is not None and (has_draft_probs is None or bool(h)) and not g
             for h, g in zip(has_draft_probs or [True] * n, greedy)]
    max_k = int(k.max())
    starts = (torch.cumsum(k + 1, 0) - (k + 1)).tolist()
    drafts_list = drafts.tolist()
    padded, q_rows, d = [], [], 0
    for ki, dense in zip(num_draft_tokens, has_q):
        padded.append(drafts_list[d:d + ki] + [0] * (max_k - ki))
        q_rows.append(list(range(d, d + ki)) + [-1] * (max_k - ki) if dense else [-1] * max_k)
        d += ki
    rows = VerifyRows(
        first=torch.tensor(starts, device=device), num_drafts=k,
        greedy=torch.tensor(greedy, device=device), forced=torch.zeros(n, dtype=torch.bool, device=device),
        drafts=torch.tensor(padded, dtype=torch.long, device=device).view(n, max_k),
        draft_q_row=torch.tensor(q_rows, dtype=torch.long, device=device).view(n, max_k))

    # Greedy argmax over all rows (mask with -inf so logits or probs both work).
    target = target_probs.float()
    argmax_input = target if allowed_mask is None else target.masked_fill(~allowed_mask, float("-inf"))
    argmax = argmax_input.argmax(-1)
    p = target if allowed_mask is None else _apply_mask(target.clamp(min=0), allowed_mask)

    # One key per request: its own generator's next draw when seeded, else the default's.
    keys = torch.randint(2**62, (n,), generator=default_generator).tolist()
    for i, gen in enumerate(generators or ()):
        if gen is not None and not greedy[i]:
            keys[i] = int(torch.randint(2**62, (1,), generator=gen))
    row_key = np.repeat(np.array(keys, dtype=np.int64), np.array(num_draft_tokens) + 1)
    position = np.arange(len(row_key)) - np.repeat(np.array(starts, dtype=np.int64), np.array(num_draft_tokens) + 1)
    u = RowUniforms.of(row_key, position, device)
    num_accepted, final = verify(rows, p, argmax, u.accept, u.draw[:, 0], draft_probs if any(has_q) else None)
    accepted_list, finals = num_accepted.tolist(), final.tolist()
    token_ids = [padded[i][:a] + [f] for i, (a, f) in enumerate(zip(accepted_list, finals))]
    return RejectionResult(token_ids, accepted_list)


class RejectionSampler:
    """Holds the default generator for unseeded requests, like `tests.sampling.Sampler`."""

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, target_probs: torch.Tensor, draft_token_ids: torch.Tensor | Sequence[int],
                 num_draft_tokens: Sequence[int], is_greedy: Sequence[bool],
                 draft_probs: torch.Tensor | None = None,
                 has_draft_probs: Sequence[bool] | None = None,
                 allowed_mask: torch.Tensor | None = None,
                 generators: Sequence[torch.Generator | None] | None = None) -> RejectionResult:
        return rejection_sample(target_probs, draft_token_ids, num_draft_tokens, is_greedy,
                                draft_probs, has_draft_probs, allowed_mask, generators,
                                self.generator)
