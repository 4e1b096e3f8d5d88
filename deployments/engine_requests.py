"""An API request as the engine requests it starts: each prompt checked against the context
(and truncated where it asks), then one `SamplingParams` per candidate (`n`, `best_of`, or
one for a beam search). Everything here is a 400 the client can act on, raised before any
engine request starts."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.request_limits import vocabulary_error
from app.models.generation_config import GenerationDefaults
from app.sampling_params import SamplingParams
from deployments.openai_errors import OpenAIError


@dataclass(frozen=True)
class EngineRequest:
    index: int  # the choice's index in the response
    prompt_index: int
    prompt_ids: list[int]
    params: SamplingParams


def engine_requests(req, prompts: list[list[int]], max_tokens: int | None, logprobs: int | None,
                    prompt_logprobs: int | None, prompt_param: str, max_model_len: int, vocab_size: int,
                    defaults: GenerationDefaults, bad_words_token_ids: list[list[int]] | None = None,
                    reply_end_ids: tuple[int, ...] = (), prediction_token_ids: list[int] | None = None
                    ) -> list[EngineRequest]:
    """`req` with the model's defaults already in; `max_tokens` as the route reads it (None: as
    many as the context holds, or the model's `max_new_tokens`); `bad_words_token_ids` and
    `prediction_token_ids`: its `bad_words` and `prediction`, tokenized (no output is longer than the
    context, so neither is a prediction the engine keeps); `reply_end_ids`: tokens that
    end every reply of this model, with its own `stop_token_ids` (harmony's `<|call|>` and
    `<|return|>`: deployments/harmony.py)."""
    limit = max_model_len
    bias = req.token_bias
    for field, token_ids in (("logit_bias", bias), ("allowed_token_ids", req.allowed_token_ids)):
        if message := vocabulary_error(field, token_ids, vocab_size):
            raise OpenAIError(400, message, param=field)
    keep = limit if req.truncate_prompt_tokens == -1 else req.truncate_prompt_tokens
    out = []
    for prompt_index, ids in enumerate(prompts):
        if not ids:
            raise OpenAIError(400, "the prompt is empty", param=prompt_param)
        if keep is not None:
            ids = ids[-keep:]
        if len(ids) >= limit:
            raise OpenAIError(400, f"This model's maximum context length is {limit} tokens, but the "
                                   f"prompt has {len(ids)} tokens; shorten it.", param=prompt_param)
        wanted = max_tokens if max_tokens is not None else limit - len(ids)
        if not req.max_tokens_given and defaults.max_tokens is not None:
            wanted = min(wanted, defaults.max_tokens)
        if len(ids) + wanted > limit:
            raise OpenAIError(400, f"This model's maximum context length is {limit} tokens, but "
                                   f"{len(ids) + wanted} were requested ({len(ids)} in the prompt, "
                                   f"{wanted} for the completion); shorten the prompt or lower "
                                   "max_tokens.", param="max_tokens")
        for j in range(req.num_candidates):
            try:
                p = SamplingParams(
                    max_tokens=wanted, temperature=req.temperature, top_p=req.top_p,
                    top_k=req.top_k, min_p=req.min_p, min_tokens=req.min_tokens,
                    seed=None if req.seed is None else req.seed + j,
                    stop_token_ids=list(dict.fromkeys([*(req.stop_token_ids or []), *reply_end_ids])),
                    ignore_eos=req.ignore_eos,
                    logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                    speculative_decoding=req.speculative_decoding,
                    prediction_token_ids=prediction_token_ids[:limit] if prediction_token_ids else None,
                    cache_salt=req.cache_salt, priority=req.priority,
                    presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                    repetition_penalty=req.repetition_penalty, logit_bias=bias,
                    allowed_token_ids=req.allowed_token_ids, bad_words_token_ids=bad_words_token_ids,
                    beam_width=req.beam_width if req.use_beam_search else 1,
                    length_penalty=req.length_penalty, early_stopping=req.early_stopping)
            except ValueError as exc:
                raise OpenAIError(400, str(exc)) from None
            out.append(EngineRequest(len(out), prompt_index, ids, p))
    return out
