"""The next step's drafts, asked for while this step's forward runs.

Served on 2 CPU cores, a speculating step at concurrency 1 waits ~6 ms for its drafts before a
~6 ms forward (benchmarks/RESULTS.md). While the target verifies a greedy request's drafts
d1..dk, the draft replica can already propose from its tokens + d1..dk: k + 1 tokens, the first
a guess at the token the target adds after the drafts. If the target accepts every draft and
its own token is that guess, the other k tokens are the next step's drafts, ready when it
begins; otherwise they are dropped and the next step asks as before. A prompt's last chunk is
sent the same way (no drafts: the guess is the first output token), so the draft model reads
the prompt while the target does, not in the first decoding step; its KV stays cached in the
draft replica even when the guess is wrong.

Greedy requests only: a greedy token is the target's argmax whatever was drafted, so drafts
from either path give the same output, and a seeded sampled request keeps drafts that depend
on its seed alone (app/engine/spec/speculator.py), never on whether a channel was up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from app.engine.request import Request
from app.engine.spec.proposal import DraftInput, Proposal


class PendingDrafts(Protocol):
    def result(self) -> list[Proposal] | None:
        """The proposals, in the order sent; None when they were lost."""


SendAhead = Callable[[list[DraftInput]], PendingDrafts | None]


@dataclass(frozen=True)
class _Sent:
    request: Request
    num_tokens: int  # the request's known tokens when its drafts were sent ahead
    drafts: tuple[int, ...]  # the drafts this step verifies, which the proposal assumed accepted


class DraftsAhead:
    """`send` after scheduling a step, `take` before drafting the next one."""

    def __init__(self, send_ahead: SendAhead, max_model_len: int):
        self._send_ahead = send_ahead
        self.max_model_len = max_model_len
        self._pending: tuple[PendingDrafts, list[_Sent]] | None = None

    def send(self, batch: dict[Request, int], k: int) -> int:
        """Ask for the next step's k drafts of every greedy row that samples after its drafts
        or its prompt this step (`batch`: the scheduled requests and their token counts);
        return for how many rows."""
        self._pending = None  # an answer nobody took is stale now (the channel still reads it)
        sent, inputs = [], []
        for req, num_new in batch.items():
            if not _samples_after_drafts_or_prompt(req, num_new):
                continue
            drafts = req.spec_token_ids
            num_after = req.num_tokens + len(drafts) + 1  # if every draft and the guess hold
            k_next = min(k, req.params.max_tokens - (req.num_output_tokens + len(drafts) + 1) - 1,
                         self.max_model_len - num_after)
            if k_next <= 0:
                continue
            sent.append(_Sent(req, req.num_tokens, tuple(drafts)))
            inputs.append(DraftInput(req.request_id, req.all_token_ids + drafts, k_next + 1,
                                     cache_salt=req.params.cache_salt))
        pending = self._send_ahead(inputs) if inputs else None
        if pending is None:
            return 0
        for s, inp in zip(sent, inputs):
            s.request.num_tokens_sent_to_draft = len(inp.token_ids)
        self._pending = (pending, sent)
        return len(sent)

    def take(self) -> dict[Request, list[int]]:
        """The drafts that hold for the tokens each request has now (waiting for the answer if
        it is still on its way)."""
        if self._pending is None:
            return {}
        pending, sent = self._pending
        self._pending = None
        proposals = pending.result()
        ready = {}
        for s, proposal in zip(sent, proposals or ()):
            guess, drafts = proposal.token_ids[:1], proposal.token_ids[1:]
            tokens = s.request.all_token_ids
            if (drafts and len(tokens) == s.num_tokens + len(s.drafts) + 1
                    and tuple(tokens[s.num_tokens:-1]) == s.drafts and tokens[-1:] == guess):
                ready[s.request] = drafts
        return ready


def _samples_after_drafts_or_prompt(req: Request, num_new: int) -> bool:
    """A greedy row that may speculate and, this step, samples after all its drafts or after its
    prompt (a prompt chunk that samples nothing, or a decode row without drafts, is not one)."""
    return (bool(req.spec_token_ids or req.num_output_tokens == 0) and not req.spec_forced
            and req.params.greedy and req.params.speculative_decoding and req.guide is None
            and req.beam_search is None and req.num_computed_tokens + num_new == req.num_tokens_with_spec)
