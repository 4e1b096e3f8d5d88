"""Draft verification and the final token, batched over requests: plain decoding is
verification with no drafts.

Request i has k_i drafts on rows first_i .. first_i + k_i - 1 and its bonus row after them.
Greedy requests keep drafts while they equal the argmax, so their output is plain greedy
decoding. Sampled requests accept draft x with min(1, p(x)/q(x)) and on a rejection draw from
norm(max(0, p - q)); the emitted tokens then follow p exactly (Leviathan et al. 2023). A
proposer without a distribution (n-gram, greedy draft) gives a point mass q: accept with p(x),
resample from p with x zeroed. Forced drafts (jump-forward) are accepted as they are.

Everything stays on the device: no boolean indexing, no `.item()`, fixed shapes given the
layout, so it can run inside a CUDA graph.
`verify_by_argmax_on_host` is the argmax chain alone over host lists, for logits that are on
the host already (the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VerifyRows:
    """Per-request tensors on the logits' device (n requests, K = max k_i)."""
    first: torch.Tensor  # [n] int64 first row
    num_drafts: torch.Tensor  # [n] int64 k_i
    greedy: torch.Tensor  # [n] bool
    forced: torch.Tensor  # [n] bool: drafts forced by the grammar
    drafts: torch.Tensor  # [n, K] int64 draft tokens, padded with 0
    draft_q_row: torch.Tensor | None = None  # [n, K] int64 row of `draft_q`, -1: point mass


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of (unnormalised) probs from uniforms u in [0, 1); deterministic given u,
    which is what makes per-request seeding batch-independent."""
    cdf = probs.cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:]
    # Below the total, so the first CDF value above the target is a token's with mass (u * total
    # may round up to the total itself).
    target = torch.minimum(u.double()[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]


def verify_by_argmax_on_host(firsts: list[int], ks: list[int], forced: list[bool], drafts: list[list[int]],
                             argmax: list[int]) -> tuple[list[int], list[int]]:
    """`verify` with no distributions (every request kept along the argmax chain), over host
    lists: for logits already on the host (the CPU), where ~20 small tensor ops took ~0.3 ms of
    a batch-1 step with the caches cold after the forward (2026-11-28)."""
    accepted, final = [], []
    for first, k, is_forced, row_drafts in zip(firsts, ks, forced, drafts):
        a = 0
        while a < k and (is_forced or row_drafts[a] == argmax[first + a]):
            a += 1
        accepted.append(a)
        final.append(argmax[first + a])
    return accepted, final


def verify(rows: VerifyRows, probs: torch.Tensor | None, argmax: torch.Tensor,
           u_accept: torch.Tensor | None, u_sample: torch.Tensor | None, draft_q: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted [n], final token [n]) for every request.

    probs: [R, V] each sampled row's distribution (None when every request is greedy);
    argmax: [R] each row's greedy token; u_accept, u_sample: [R] uniforms per row (None when
    there are no drafts / every request is greedy);
    draft_q: [D, V] the draft's distributions that `rows.draft_q_row` points into."""
    n, max_k = rows.drafts.shape
    num_rows = argmax.shape[0]
    if max_k == 0 and num_rows == n:  # plain decoding: one row per request, nothing to verify
        num_accepted = torch.zeros(n, dtype=torch.long, device=argmax.device)
        if probs is None:
            return num_accepted, argmax
        sampled = sample_inverse_cdf(probs, u_sample)
        return num_accepted, torch.where(rows.greedy, argmax, sampled)
    j = torch.arange(max_k, device=argmax.device)[None, :]
    t_rows = (rows.first[:, None] + j).clamp(max=num_rows - 1)
    valid = j < rows.num_drafts[:, None]
    x = rows.drafts
    accept = x == argmax[t_rows]
    if probs is not None:
        q_x = torch.ones(n, max_k, dtype=torch.float64, device=argmax.device)
        if draft_q is not None:
            dense = rows.draft_q_row >= 0
            q_rows = rows.draft_q_row.clamp(min=0)
            q_x = torch.where(dense, draft_q[q_rows, x].double(), q_x)
        sampled_ok = u_accept[t_rows] * q_x < probs[t_rows, x].double()  # probability min(1, p/q)
        accept = torch.where(rows.greedy[:, None], accept, sampled_ok)
    accept = (accept | rows.forced[:, None]) & valid
    num_accepted = accept.long().cumprod(-1).sum(-1)

    final_rows = rows.first + num_accepted
    greedy_final = argmax[final_rows]
    if probs is None:
        return num_accepted, greedy_final
    final = probs[final_rows].masked_fill(rows.greedy[:, None], 1.0)  # greedy rows may hold logits
    rejected = (num_accepted < rows.num_drafts) & ~rows.greedy & ~rows.forced
    at = num_accepted.clamp(max=max(max_k - 1, 0))[:, None]
    residual = final
    if max_k:
        rejected_x = x.gather(1, at)
        residual = final.scatter(-1, rejected_x, 0.0)  # point mass q
        if draft_q is not None:
            q_row = rows.draft_q_row.gather(1, at)[:, 0]
            dense_residual = (final - draft_q[q_row.clamp(min=0)].float()).clamp(min=0)
            residual = torch.where((q_row >= 0)[:, None], dense_residual, residual)
        # p == q up to rounding leaves no residual mass; p itself is then the right answer.
        residual = torch.where((residual.sum(-1) > 0)[:, None], residual, final)
    dist = torch.where(rejected[:, None], residual, final)
    sampled = sample_inverse_cdf(dist, u_sample[final_rows])
    return num_accepted, torch.where(rows.greedy, greedy_final, sampled)
