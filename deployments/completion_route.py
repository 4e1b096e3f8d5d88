"""The body of a completion, whole or streamed: each choice's text with its logprobs, the prompt
before it with `echo`, `best_of`'s likeliest candidates, beam search's hypotheses.

A mixin of the Ingress deployment (deployments/ingress.py), which keeps the route itself (see
deployments/responses_route.py for why routes stay there); it uses the Ingress's tokenizer, token
names and usage.
"""

from __future__ import annotations

from typing import AsyncIterator

from fastapi.responses import StreamingResponse

from deployments.beam_choices import beam_texts
from deployments.best_of import keep_likeliest
from deployments.choices import Choice, Event, guarded_stream, merge_choices, sse, usage_of
from deployments.echo import echo_logprobs, joined, vllm_prompt_logprobs
from deployments.output_logprobs import completion_logprobs
from deployments.protocol import CompletionRequest
from deployments.responses import CompletionChoice, CompletionResponse


class CompletionRoutes:
    async def _completion_reply(self, request_id: str, created: int, body: CompletionRequest, choices: list[Choice],
                                ranked: bool):
        """The response to a completion whose choices have started; `ranked`: `best_of` candidates
        more than `n`, ranked by their tokens' logprobs."""
        if body.use_beam_search:
            beams = beam_texts(choices, body.n)
            return CompletionResponse(
                id=request_id, created=created, model=self.model_name, usage=usage_of(choices),
                choices=[CompletionChoice(index=b.index, text=b.text, finish_reason=b.finish_reason,
                                          stop_reason=b.stop_reason) for b in beams])
        to_echo = {}  # the prompt text still to put before each choice's first chunk
        if body.echo:  # the prompt as sent, or as the engine read it when truncated
            texts = [p if isinstance(p, str) and body.truncate_prompt_tokens is None else None
                     for p in body.prompts()]
            to_echo = {c.index: texts[c.prompt_index] or self.tokenizer.decode(c.prompt_ids) for c in choices}
        if body.stream:
            stream = self._stream_completion(request_id, created, body, choices, to_echo)
            return StreamingResponse(guarded_stream(request_id, choices, stream), media_type="text/event-stream")
        merged = {c.index: CompletionChoice(index=c.index, text="") for c in choices}
        cumulative_logprob = {c.index: 0.0 for c in choices}
        async for event in merge_choices(choices):
            part, whole = self._completion_choice(body, event, to_echo), merged[event.choice.index]
            cumulative_logprob[event.choice.index] += sum(lp.logprob for lp in event.logprobs or ())
            whole.text += part.text
            whole.logprobs = joined(whole.logprobs, part.logprobs)
            whole.prompt_logprobs = whole.prompt_logprobs or part.prompt_logprobs
        for c in choices:
            merged[c.index].finish_reason, merged[c.index].stop_reason = c.finish_reason, c.stop_reason
        returned = list(merged.values())
        if ranked:
            returned = keep_likeliest(returned, {c.index: c.prompt_index for c in choices},
                                      cumulative_logprob, body.n)
            if body.logprobs is None:
                returned = [c.model_copy(update={"logprobs": None}) for c in returned]
        return CompletionResponse(id=request_id, created=created, model=self.model_name,
                                  usage=usage_of(choices), choices=returned)

    def _completion_choice(self, body: CompletionRequest, event: Event, to_echo: dict[int, str]
                           ) -> CompletionChoice:
        """One event as a choice chunk; with `echo`, the choice's first chunk starts with its prompt
        (`to_echo` holds the prompts not yet echoed, by choice index)."""
        c = event.choice
        prefix, prefix_logprobs = to_echo.pop(c.index, ""), None
        if prefix and body.logprobs is not None and event.prompt_logprobs:
            prefix_logprobs = echo_logprobs(c.prompt_ids, event.prompt_logprobs, body.logprobs, self._token_names(body))
        c.text_len += len(prefix)
        logprobs = joined(prefix_logprobs, completion_logprobs(event.logprobs, c.text_len, self._token_names(body)))
        c.text_len += len(event.text)
        scored = None
        if body.prompt_logprobs is not None and event.prompt_logprobs:
            scored = vllm_prompt_logprobs(event.prompt_logprobs, body.prompt_logprobs, self._token_names(body))
        return CompletionChoice(index=c.index, text=prefix + event.text, logprobs=logprobs,
                                finish_reason=event.finish_reason, stop_reason=event.stop_reason,
                                prompt_logprobs=scored)

    async def _stream_completion(self, request_id: str, created: int, body: CompletionRequest,
                                 choices: list[Choice], to_echo: dict[int, str]) -> AsyncIterator[str]:
        async for event in merge_choices(choices):
            yield sse(CompletionResponse(id=request_id, created=created, model=self.model_name,
                                         choices=[self._completion_choice(body, event, to_echo)],
                                         usage=self._chunk_usage(body, choices, (event.choice.index,))))
        if body.include_usage:
            yield sse(CompletionResponse(id=request_id, created=created, model=self.model_name,
                                          choices=[], usage=usage_of(choices)))
