"""The prompt in a completion's response: OpenAI's `echo` (the prompt's text and, with
`logprobs`, its tokens' logprobs before the completion's) and vLLM's `prompt_logprobs`.

The engine scores the prompt (app/engine/selection/prompt_logprobs.py) and hands the scores
over in the request's first output; nothing scores the first prompt token, so its entry is None.
"""

from typing import Callable

from app.outputs import TokenLogprob
from deployments.responses import CompletionLogprobs, PromptTokenLogprob

TokenText = Callable[[int], str]


def echo_logprobs(prompt_ids: list[int], scored: list[TokenLogprob | None], top_n: int,
                  token_text: TokenText) -> CompletionLogprobs:
    """The prompt's tokens in OpenAI's completion logprobs shape, offsets from the text's start."""
    out = CompletionLogprobs()
    offset = 0
    for token_id, lp in zip(prompt_ids, scored):
        token = token_text(token_id)
        out.tokens.append(token)
        out.token_logprobs.append(None if lp is None else lp.logprob)
        out.top_logprobs.append(None if lp is None else
                                {token_text(t): v for t, v in list(lp.top.items())[:top_n]})
        out.text_offset.append(offset)
        offset += len(token)
    return out


def vllm_prompt_logprobs(scored: list[TokenLogprob | None], top_n: int, token_text: TokenText
                         ) -> list[dict[int, PromptTokenLogprob] | None]:
    """vLLM's `prompt_logprobs`: per prompt token, its own entry and its top `top_n` alternatives."""
    out: list[dict[int, PromptTokenLogprob] | None] = []
    for lp in scored:
        if lp is None:
            out.append(None)
            continue
        entries = {t: PromptTokenLogprob(logprob=v, rank=rank, decoded_token=token_text(t))
                   for rank, (t, v) in enumerate(list(lp.top.items())[:top_n], start=1)}
        entries[lp.token_id] = PromptTokenLogprob(logprob=lp.logprob, rank=lp.rank,
                                                  decoded_token=token_text(lp.token_id))
        out.append(entries)
    return out


def joined(first: CompletionLogprobs | None, then: CompletionLogprobs | None) -> CompletionLogprobs | None:
    if first is None or then is None:
        return first or then
    return CompletionLogprobs(tokens=first.tokens + then.tokens,
                              token_logprobs=first.token_logprobs + then.token_logprobs,
                              top_logprobs=first.top_logprobs + then.top_logprobs,
                              text_offset=first.text_offset + then.text_offset)
