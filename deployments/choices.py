"""One engine request per OpenAI choice, and the SSE plumbing around them (`guarded_stream`:
the body of a streamed response, errors reported in-band).

A `Choice` owns the target-side stream of one choice, detokenizes it incrementally and closes
(aborts) it when done; `merge_choices` interleaves the choices of a request as their steps arrive.
"""

import asyncio
import dataclasses
import json
import logging
from typing import AsyncIterator

from deployments.detokenizer import IncrementalDetokenizer
from deployments.errors import REPLICA_LOST, replica_lost
from deployments.openai_errors import error_message
from deployments.responses import CompletionTokensDetails, ErrorInfo, ErrorResponse, PromptTokensDetails, UsageInfo
from deployments.metrics import RequestTimer

logger = logging.getLogger("ray.serve")

# -- one engine request (one choice) ----------------------------------------------------------
@dataclasses.dataclass
class Event:
    choice: "Choice"
    text: str
    token_ids: list[int]
    logprobs: list | None
    finish_reason: str | None
    prompt_logprobs: list | None = None  # in the choice's first event, when asked
    stop_reason: str | int | None = None  # with finish_reason "stop": the stop string or own stop token


class Choice:
    """One engine request: its stream from the target, detokenizer, metrics and counts."""

    def __init__(self, index: int, prompt_index: int, prompt_ids: list[int], stream,
                 detok: IncrementalDetokenizer, timer: RequestTimer, predicted: bool = False):
        self.index = index
        self.prompt_index = prompt_index
        self.prompt_ids = prompt_ids
        self.stream = stream
        self.detok = detok
        self.timer = timer
        self.first = None
        self.num_output_tokens = 0
        self.num_cached_tokens = 0  # of the prompt's tokens, those the prefix cache held
        self.predicted = predicted  # the request has a `prediction`: its usage counts what came of it
        self.num_accepted_prediction_tokens = self.num_rejected_prediction_tokens = 0
        self.finish_reason: str | None = None
        # vLLM's `stop_reason`: the stop string or the request's own stop token id that ended
        # the choice; None when it ended otherwise (the model's EOS included).
        self.stop_reason: str | int | None = None
        self.closed = False
        self.text_len = 0
        self.unreported_ids: list[int] = []  # tokens of outputs that made no event: the next one's

    async def start(self) -> None:
        """Await the first output, so refusals surface before the response starts."""
        self.first = await self.stream.__anext__()

    async def outputs(self):
        if self.first is not None:
            first, self.first = self.first, None
            yield first
        async for out in self.stream:
            yield out

    def advance(self, out) -> Event | None:
        self.num_output_tokens = max(self.num_output_tokens, out.num_output_tokens)
        self.num_cached_tokens = out.num_cached_tokens
        if self.predicted:
            self.num_accepted_prediction_tokens = out.num_accepted_prediction_tokens
            self.num_rejected_prediction_tokens = out.num_rejected_prediction_tokens
        self.timer.on_tokens(len(out.new_token_ids))
        text = self.detok.add_tokens(out.new_token_ids)
        if self.detok.stopped:
            self.finish_reason, self.stop_reason = "stop", self.detok.stop_reason
        elif out.finished:
            text += self.detok.finish()
            self.finish_reason, self.stop_reason = out.finish_reason or "stop", out.stop_token_id
        token_ids = self.unreported_ids + out.new_token_ids if self.unreported_ids else out.new_token_ids
        if not text and not out.new_logprobs and out.prompt_logprobs is None and self.finish_reason is None:
            self.unreported_ids = token_ids
            return None
        self.unreported_ids = []
        return Event(self, text, token_ids, out.new_logprobs, self.finish_reason,
                     out.prompt_logprobs, self.stop_reason)

    def close(self, record: bool = True) -> None:
        """Idempotent: end the engine request if it still runs, and record the metrics
        (not for a request refused before it started)."""
        if self.closed:
            return
        self.closed = True
        if self.finish_reason is None or self.detok.stopped:
            self.stream.cancel()  # aborts the engine request, frees its KV blocks
        if record:
            self.timer.on_finish(self.finish_reason or "abort", len(self.prompt_ids),
                                 self.num_output_tokens)

    def __del__(self):
        # A streaming response whose body never started (the client left during the headers)
        # never runs its generator's cleanup; dropping the choice still ends its engine request.
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort during garbage collection
            pass

    async def events(self) -> AsyncIterator[Event]:
        try:
            async for out in self.outputs():
                event = self.advance(out)
                if self.finish_reason is not None:
                    self.close()  # metrics at the last token, not when the consumer moves on
                if event is not None:
                    yield event
                if self.finish_reason is not None:
                    return
        finally:
            self.close()


def usage_of(choices: list[Choice]) -> UsageInfo:
    """Each prompt counted once: its length, and its cached tokens as the choice that found
    the fewest (the later choices of a prompt may find the first one's blocks)."""
    prompt = sum({c.prompt_index: len(c.prompt_ids) for c in choices}.values())
    cached: dict[int, int] = {}
    for c in choices:
        cached[c.prompt_index] = min(cached.get(c.prompt_index, c.num_cached_tokens), c.num_cached_tokens)
    completion = sum(c.num_output_tokens for c in choices)
    details = None
    if any(c.predicted for c in choices):
        details = CompletionTokensDetails(
            accepted_prediction_tokens=sum(c.num_accepted_prediction_tokens for c in choices),
            rejected_prediction_tokens=sum(c.num_rejected_prediction_tokens for c in choices))
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(cached.values())),
                     completion_tokens_details=details)


async def merge_choices(choices: list[Choice]) -> AsyncIterator[Event]:
    """Events of all choices as they come (one choice: no tasks, no queue)."""
    if len(choices) == 1:
        async for event in choices[0].events():
            yield event
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(c: Choice) -> None:
        try:
            async for event in c.events():
                await queue.put(event)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put(exc)
        finally:
            await queue.put(done)

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        for c in choices:
            c.close()


def sse(payload) -> str:
    body = payload.model_dump_json() if hasattr(payload, "model_dump_json") else json.dumps(payload)
    return f"data: {body}\n\n"


async def guarded_stream(request_id: str, choices: list[Choice], chunks: AsyncIterator[str]
                         ) -> AsyncIterator[str]:
    """The SSE body around a route's chunks: an error after the stream started is reported
    in-band, every choice is closed (aborting what is still running), and `[DONE]` ends it."""
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        message = stream_failure_message(request_id, exc)
        yield sse(ErrorResponse(error=ErrorInfo(message=message, type="internal_error", code="500")))
    finally:
        for c in choices:
            c.close()
    yield "data: [DONE]\n\n"


def stream_failure_message(request_id: str, exc: Exception) -> str:
    """What a client is told in-band when its stream failed after it began (the error is logged)."""
    logger.exception("stream %s failed", request_id, exc_info=exc)
    return REPLICA_LOST if replica_lost(exc) else error_message(exc)
