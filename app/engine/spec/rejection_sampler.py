"""Rejection sampling for speculative decoding, batched over a flattened layout.

Request i has k_i draft tokens and 1 + k_i target rows (its k_i verified positions plus the
bonus position). Greedy requests keep drafts while they equal the target argmax, so output is
identical to plain greedy decoding. Sampled requests accept a draft x with min(1, p(x)/q(x))
and resample a rejection from norm(max(0, p - q)); the emitted tokens then follow p exactly
(Leviathan et al. 2023). Proposers without a distribution (n-gram, greedy draft) give a point
mass q: accept with p(x), resample from p with x zeroed.

Randomness: each sampled request uses k_i + 1 uniforms drawn up front in a fixed order, from
its own generator when it has one, so a seeded request's tokens do not depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class RejectionResult:
    token_ids: list[list[int]]  # per request: accepted drafts + one corrected/bonus token
    num_accepted: list[int]  # per request: how many drafts were accepted (0..k_i)


def _sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of (unnormalised) probs from uniforms u in [0, 1); vectorised and
    deterministic given u, which is what makes per-request seeding batch-independent."""
    cdf = probs.double().cumsum(-1)
    idx = torch.searchsorted(cdf, (u.double() * cdf[:, -1])[:, None], right=True)[:, 0]
    # Rounding at the top end may land past the last non-zero token: clamp onto it.
    vocab = torch.arange(probs.shape[-1], device=probs.device)
    last_nonzero = torch.where(probs > 0, vocab, 0).amax(-1)
    return torch.minimum(idx, last_nonzero)


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

    greedy = torch.tensor(list(is_greedy), dtype=torch.bool, device=device)
    has_q = torch.zeros(n, dtype=torch.bool, device=device)
    if draft_probs is not None:
        has_q = (torch.ones_like(has_q) if has_draft_probs is None
                 else torch.tensor(list(has_draft_probs), dtype=torch.bool, device=device))
    has_q &= ~greedy

    # Padded [n, K] view: request i, position j -> target row t_start[i] + j, draft d_start[i] + j.
    max_k = int(k.max())
    t_start = torch.cumsum(k + 1, 0) - (k + 1)
    d_start = t_start - torch.arange(n, device=device)
    pos = torch.arange(max_k, device=device)[None, :]
    valid = pos < k[:, None]
    t_rows = t_start[:, None] + pos
    d_rows = (d_start[:, None] + pos).clamp(max=max(total_drafts - 1, 0))
    t_rows = t_rows.clamp(max=target_probs.shape[0] - 1)
    x = drafts[d_rows] if max_k else torch.zeros_like(t_rows)

    # Greedy argmax over all rows (mask with -inf so logits or probs both work).
    rows = target_probs.float()
    argmax_input = rows if allowed_mask is None else rows.masked_fill(~allowed_mask, float("-inf"))
    argmax = argmax_input.argmax(-1)
    p = rows if allowed_mask is None else _apply_mask(rows.clamp(min=0), allowed_mask)

    # Uniforms: K acceptance draws + 1 for the final token, per request; seeded requests
    # consume exactly k_i + 1 from their own generator.
    u = torch.rand(n, max_k + 1, dtype=torch.float64, generator=default_generator).to(device)
    for i, gen in enumerate(generators or ()):
        if gen is not None and not is_greedy[i]:
            ki = num_draft_tokens[i]
            own = torch.rand(ki + 1, dtype=torch.float64, generator=gen).to(device)
            u[i, :ki] = own[:ki]
            u[i, max_k] = own[ki]

    if max_k:
        p_x = p[t_rows, x].double()
        q_x = torch.ones_like(p_x)
        if draft_probs is not None:
            q_x = torch.where(has_q[:, None], draft_probs[d_rows, x].double(), q_x)
        sampled_ok = u[:, :max_k] * q_x < p_x  # u < p/q: probability min(1, p/q)
        greedy_ok = x == argmax[t_rows]
        accept = torch.where(greedy[:, None], greedy_ok, sampled_ok) & valid
        num_accepted = accept.long().cumprod(-1).sum(-1)
    else:
        num_accepted = torch.zeros(n, dtype=torch.long, device=device)

    # Final token at position j* = num_accepted: the bonus if all drafts passed, else the
    # resample from the residual distribution.
    final_rows = t_start + num_accepted
    final = p[final_rows].masked_fill(greedy[:, None], 1.0)  # greedy rows may hold logits
    rejected = (num_accepted < k) & ~greedy
    if rejected.any():
        rej = rejected.nonzero()[:, 0]
        rej_d = d_start[rej] + num_accepted[rej]
        residual = final[rej]
        dense = has_q[rej]
        if dense.any():
            residual[dense] = (residual[dense] - draft_probs[rej_d[dense]].float()).clamp(min=0)
        point = ~dense
        if point.any():
            residual[point] = residual[point].scatter(-1, drafts[rej_d[point]][:, None], 0.0)
        # p == q up to rounding leaves no residual mass; p itself is then the right answer.
        empty = residual.sum(-1) <= 0
        residual[empty] = final[rej][empty]
        final[rej] = residual
    final_tokens = torch.where(greedy, argmax[final_rows], _sample_inverse_cdf(final, u[:, max_k]))

    accepted_list = num_accepted.tolist()
    drafts_list, finals = drafts.tolist(), final_tokens.tolist()
    starts = d_start.tolist()
    token_ids = [drafts_list[s:s + a] + [f] for s, a, f in zip(starts, accepted_list, finals)]
    return RejectionResult(token_ids, accepted_list)


class RejectionSampler:
    """Holds the default generator for unseeded requests, like `Sampler`."""

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
