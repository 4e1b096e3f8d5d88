"""What the engine hands back each step: the new tokens of one request, ready to stream."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)  # top-n alternatives, id -> logprob
    rank: int | None = None  # 1 + how many tokens were likelier (prompt tokens only, as vLLM's)


@dataclass
class BeamHypothesis:
    """One finished beam of a beam search, as returned (best first)."""
    token_ids: list[int]  # output tokens, ending with the stop token when one ended it
    cumulative_logprob: float
    score: float  # cumulative_logprob / len(token_ids) ** length_penalty
    finish_reason: str  # "stop" or "length"
    stop_token_id: int | None = None  # the request's own stop token that ended it (not the EOS)


@dataclass
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort"
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    new_logprobs: list[TokenLogprob] | None = None
    error: str | None = None  # set when the engine refused or failed the request
    # In the request's first output, when it asked: one per prompt token, the first None.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # A beam search's one output (its last): the best hypotheses, best first.
    beams: list[BeamHypothesis] | None = None
    # Set when one of the request's own `stop_token_ids` ended it (the model's EOS does not).
    stop_token_id: int | None = None
    # Of the request's `prediction`: the tokens the output so far holds (OpenAI's accepted prediction
    # tokens), and the rest of it (rejected); both 0 where speculation is off (nothing reads a prediction).
    num_accepted_prediction_tokens: int = 0
    num_rejected_prediction_tokens: int = 0

    def followed_by(self, later: "RequestOutput") -> "RequestOutput":
        """This output and the next one of the same request as one chunk (fewer stream hops
        when the reader falls behind the engine)."""
        logprobs = None
        if self.new_logprobs is not None or later.new_logprobs is not None:
            logprobs = (self.new_logprobs or []) + (later.new_logprobs or [])
        return RequestOutput(self.request_id, self.new_token_ids + later.new_token_ids,
                             later.finished, later.finish_reason, later.num_prompt_tokens,
                             later.num_output_tokens, later.num_cached_tokens, logprobs, later.error,
                             self.prompt_logprobs or later.prompt_logprobs, later.beams, later.stop_token_id,
                             later.num_accepted_prediction_tokens, later.num_rejected_prediction_tokens)


class RequestRejected(ValueError):
    """A request that can never be served (too long for the model or for the KV pool)."""


class EngineOverloaded(RuntimeError):
    """The engine's waiting queue is full (`max_num_waiting_requests`); the client should retry
    later. Not the request's fault, so not a ValueError: the ingress answers 429."""


class EngineDied(RuntimeError):
    """The engine process of a target replica exited; the replica fails its health check and
    Serve replaces it, so the client should retry (the ingress answers 503)."""
