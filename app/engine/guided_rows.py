"""Guided decoding inside the engine step: grammar masks on the logits, drafts kept inside the
grammar, and jump-forward.

A guided request holds a `GuidedDecoder` (app/guided/guide.py). Before scheduling, a decoding
request whose grammar forces a string (a schema's fixed keys and punctuation) gets those
tokens as drafts marked `spec_forced`: the target runs them as one 1 + k query and keeps them
without rejection sampling, so their KV is filled in one pass (jump-forward). Proposed drafts
are cut at the first token the grammar rejects. After the forward, every sampled row of a
guided request gets its bitmask (one row, or 1 + k along the drafts) before sampling or
verification, so guided and unguided requests, with different formats, share one batch.
"""

from __future__ import annotations

import torch

from app.engine.request import Request
from app.guided.vocabulary import allocate_token_bitmask, apply_token_bitmask


def plan_guided_drafts(running: list[Request], tokenizer, max_model_len: int, jump_forward: bool) -> None:
    """Forced tokens for guided decoding requests; proposed drafts cut to what the grammar allows."""
    for req in running:
        guide = req.guide
        if guide is None or not req.is_decoding:
            continue
        room = min(req.params.max_tokens - req.num_output_tokens - 1, max_model_len - req.num_tokens)
        forced = guide.forced_token_ids(tokenizer)[:max(room, 0)] if jump_forward and jumps_forward(req) else []
        if forced:
            req.set_spec(forced, forced=True)
        elif req.spec_token_ids:
            allowed = guide.accept_prefix(req.spec_token_ids)
            guide.rollback(allowed)
            req.trim_spec(allowed)


def mask_guided_rows(logits: torch.Tensor, sampled: list[tuple[Request, int]],
                     jump_forward_tokenizer=None) -> torch.Tensor:
    """`logits` with disallowed ids at -inf on the rows of guided requests. `sampled`: (request,
    first row) for every request sampled this step, whose rows are the 1 + len(drafts) from
    there. With jump-forward (its tokenizer given), a row where the format forces text allows
    only the token jump-forward would insert. Returns `logits` itself when no request is
    guided."""
    guided = [(req, row) for req, row in sampled if req.guide is not None]
    if not guided:
        return logits
    bitmask = allocate_token_bitmask(logits.shape[0], logits.shape[1])
    for req, row in guided:
        tokenizer = jump_forward_tokenizer if jump_forward_tokenizer is not None and jumps_forward(req) else None
        if req.spec_token_ids:
            req.guide.fill_draft_bitmasks(bitmask, row, req.spec_token_ids, tokenizer)
        else:
            req.guide.fill_bitmask(bitmask, row, tokenizer)
    return apply_token_bitmask(logits.clone(), bitmask)


def jumps_forward(req: Request) -> bool:
    """Whether the tokens a format forces may be inserted for `req` unsampled: not where the
    request bars tokens of its own (`allowed_token_ids`, `bad_words`), which a forced token's
    tokenization could hold; its rows are sampled inside the format instead."""
    return req.params.allowed_token_ids is None and not req.params.bad_words_token_ids
