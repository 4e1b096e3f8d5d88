"""One request's state inside the engine.

The scheduler's single rule: `all_token_ids` is what the request should have in its KV
cache, `num_computed_tokens` is how much already is; each step closes part of the gap.
"""

from __future__ import annotations

import enum

import torch

from app.sampling_params import SamplingParams


PENDING_TOKEN = -1  # a token a step still running on the device has chosen (overlapped scheduling)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def ending_eos_token_ids(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> frozenset[int]:
    """The model's EOS tokens where they end a request (not under `ignore_eos`)."""
    return frozenset() if params.ignore_eos else frozenset(eos_token_ids)


def stop_token_ids(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> frozenset[int]:
    """The tokens that end a request: the model's EOS (unless `ignore_eos`) and the request's own."""
    return frozenset(params.stop_token_ids) | ending_eos_token_ids(params, eos_token_ids)


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_ids: tuple[int, ...] = ()):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.stop_token_ids = stop_token_ids(params, eos_token_ids)
        self.eos_token_ids = ending_eos_token_ids(params, eos_token_ids)
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hits at first admission
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_token_id: int | None = None  # of the request's own stop tokens, the one that ended it
        self.num_preemptions = 0
        self.num_emitted_tokens = 0  # output tokens already handed to the caller
        # One per prompt token once the prompt has run (the first is None: nothing scores it).
        self.prompt_logprobs: list | None = [None] if params.prompt_logprobs is not None else None
        # Speculation: draft tokens proposed for this step, scheduled after the known tokens
        # and verified by the target; never part of `all_token_ids` until accepted.
        self.spec_token_ids: list[int] = []
        self.draft_probs: torch.Tensor | None = None  # [len(spec), V] draft distribution, or None
        self.spec_forced = False  # the drafts are forced by the grammar (kept without verification)
        self.spec_from_prediction = False  # the drafts are the request's `prediction`'s
        self.num_tokens_sent_to_draft = 0  # of its tokens, those the draft model was last given to read
        self.guide = None  # a GuidedDecoder when the output must follow a format
        self.beam_search = None  # the BeamSearch this request runs one beam of

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def is_decoding(self) -> bool:
        """All known tokens but the last are in the KV cache: the next step samples."""
        return self.num_computed_tokens == self.num_tokens - 1

    def set_spec(self, token_ids: list[int], probs: torch.Tensor | None = None, forced: bool = False,
                 from_prediction: bool = False) -> None:
        self.spec_token_ids = list(token_ids)
        self.draft_probs = probs if token_ids else None
        self.spec_forced = forced and bool(token_ids)
        self.spec_from_prediction = from_prediction and bool(token_ids)

    def trim_spec(self, keep: int) -> None:
        """Keep the first `keep` draft tokens (the step's budget ran short)."""
        keep = max(keep, 0)
        if keep < len(self.spec_token_ids):
            self.spec_token_ids = self.spec_token_ids[:keep]
            self.draft_probs = None if self.draft_probs is None or not keep else self.draft_probs[:keep]
            self.spec_forced = self.spec_forced and keep > 0

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def penalised(self) -> bool:
        """Its logits change before this step's choice: a penalty or bias, or stop tokens
        barred until `min_tokens` are out (app/engine/selection/penalties.py)."""
        p = self.params
        return p.penalised or (p.min_tokens > 0 and self.num_output_tokens < p.min_tokens)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def has_pending_token(self) -> bool:
        return self.all_token_ids[-1] == PENDING_TOKEN

    def reserve_token(self) -> None:
        """Hold the place of the token a step in flight is choosing, so the next step can be
        scheduled (its input is read on the device) before the token reaches the host."""
        self.all_token_ids.append(PENDING_TOKEN)

    def fill_pending_token(self, token_id: int) -> None:
        self.all_token_ids.pop()
        self.append_token(token_id)

    def append_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)
        if self.guide is not None:
            self.guide.advance(token_id)
        if token_id in self.stop_token_ids:
            self.finish("stop")
            if token_id not in self.eos_token_ids:  # the model's EOS is no stop reason, as in vLLM
                self.stop_token_id = token_id
        elif self.guide is not None and self.guide.is_finished:  # the format is complete
            self.finish("stop")
        elif self.num_output_tokens >= self.params.max_tokens:
            self.finish("length")

    def finish(self, reason: str) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
