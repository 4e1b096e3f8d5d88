"""What a request is checked against before it is queued.

A plain record of a few numbers, so that a front running the engine in another process
refuses an impossible request itself, at once, with the same message the engine would give.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.outputs import RequestRejected
from app.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestLimits:
    max_model_len: int
    block_size: int
    num_blocks: int  # the whole KV pool
    vocab_size: int
    priority_scheduling: bool = False  # the engine's policy is "priority": a request's priority counts

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestRejected for a request that could never be served."""
        n = len(prompt_token_ids)
        if n == 0:
            raise RequestRejected("the prompt is empty; send at least one token")
        if n + params.max_tokens > self.max_model_len:
            raise RequestRejected(
                f"this model's maximum context length is {self.max_model_len} tokens, but "
                f"{n} prompt tokens + {params.max_tokens} max_tokens were requested; "
                "shorten the prompt or lower max_tokens")
        needed = -(-(n + params.max_tokens) // self.block_size)
        if needed > self.num_blocks:
            raise RequestRejected(
                f"the request needs {needed} KV blocks but the whole pool has "
                f"{self.num_blocks}; lower max_tokens or the prompt length")
        if params.beam_search:
            self.check_beam_search(n, params)
        if any(not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise RequestRejected(f"prompt token ids must be in [0, {self.vocab_size})")
        if params.priority != 0 and not self.priority_scheduling:
            raise RequestRejected(f"priority {params.priority} needs the \"priority\" scheduling policy; "
                                  "this engine serves first come, first served (priority 0)")
        self.check_token_ids("logit_bias", params.logit_bias)
        self.check_token_ids("allowed_token_ids", params.allowed_token_ids)

    def check_beam_search(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """The beams share the prompt's full blocks; past those, each may hold its own."""
        shared = num_prompt_tokens // self.block_size
        own = -(-(num_prompt_tokens - shared * self.block_size + params.max_tokens) // self.block_size)
        needed = shared + params.beam_width * own
        if needed > self.num_blocks:
            raise RequestRejected(
                f"beam search with {params.beam_width} beams may need {needed} KV blocks but the whole "
                f"pool has {self.num_blocks}; lower the number of beams, max_tokens or the prompt length")

    def check_token_ids(self, field: str, token_ids) -> None:
        if message := vocabulary_error(field, token_ids, self.vocab_size):
            raise RequestRejected(message)


def vocabulary_error(field: str, token_ids, vocab_size: int) -> str | None:
    """The refusal of a request field's token ids (logit_bias, allowed_token_ids) outside the
    vocabulary, or None when they are all in it."""
    outside = [t for t in token_ids or () if not 0 <= t < vocab_size]
    if not outside:
        return None
    return f"{field}: token id {outside[0]} is not in the vocabulary (ids are in [0, {vocab_size}))"
