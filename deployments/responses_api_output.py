"""A Responses API answer, built from the one chat choice the ingress ran for it: whole, or as
the stream of events OpenAI sends (`response.created`, ..., `response.completed`).

Output items come in the order the model wrote them: its reasoning (a thinking model's, with
the app's `reasoning_parser`), a message with the text (when there is text, or when there are no
calls: an empty message), then one `function_call` item per call.
An output cut at `max_output_tokens` makes the response `incomplete` with that reason, as
OpenAI reports it.

The stream: `response.created` and `response.in_progress`; the reasoning item, its part and its
`response.reasoning_text.delta`s, closed when the answer begins; the message item and its text part
opened when its first text is known not to open a call (deployments/tool_call_stream.py:
ToolStream), then `response.output_text.delta` per step, and the message closed when the first
call opens or the output ends; each call as an item opened once its name is known, its arguments
as `response.function_call_arguments.delta`s as they are written, and the item closed when the
next call opens or the output ends; then `response.completed` (or
`response.incomplete`) with the whole response. Every event has its `sequence_number`. An error
after the stream began ends it with `response.failed`.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from pydantic_core import to_jsonable_python

from deployments.choices import Event, stream_failure_message
from deployments.harmony import HarmonyReply
from deployments.reasoning import ReasoningStream
from deployments.request_ids import new_id
from deployments.responses import ChatTokenLogprob
from deployments.responses_api_protocol import (FunctionToolCall, IncompleteDetails, OutputItem, OutputMessage,
                                                OutputText, ReasoningItem, ReasoningText, ResponseError,
                                                ResponseObject, ResponseUsage)
from deployments.tool_protocol import ToolCall


class ResponseOutput:
    """The output of one response as it grows: reasoning, text and its logprobs, then the calls."""

    def __init__(self, with_logprobs: bool, reasoning_stream: ReasoningStream | HarmonyReply | None = None):
        """`reasoning_stream`: how the output splits into reasoning and answer (all answer without)."""
        self.reasoning_stream = reasoning_stream or ReasoningStream(thinking=False)
        self.reasoning_id = new_id("rs", "_")
        self.reasoning = ""
        self.message_id = new_id("msg", "_")
        self.text = ""
        self.logprobs: list[ChatTokenLogprob] | None = [] if with_logprobs else None
        self.calls: list[FunctionToolCall] = []

    def split(self, event: Event) -> tuple[str, str]:
        """An event's (reasoning, answer) text; the reasoning is kept."""
        reasoning, answer = self.reasoning_stream.take(event.text, event.finish_reason is not None, event.token_ids)
        self.reasoning += reasoning
        return reasoning, answer

    @property
    def reasoning_tokens(self) -> int:
        return self.reasoning_stream.reasoning_tokens

    def add(self, text: str, logprobs: list[ChatTokenLogprob]) -> None:
        self.text += text
        if self.logprobs is not None:
            self.logprobs.extend(logprobs)

    def open_call(self, call: ToolCall) -> None:
        """A call whose name is known; its arguments follow (`add_arguments`)."""
        self.calls.append(FunctionToolCall(id=f"fc_{call.id.removeprefix('call_')}", call_id=call.id,
                                           name=call.function.name, arguments=""))

    def add_arguments(self, k: int, text: str) -> None:
        self.calls[k].arguments += text

    @property
    def has_message(self) -> bool:
        """Text, or nothing else: a reply cut while reasoning has its reasoning item only."""
        return bool(self.text) or not (self.calls or self.reasoning)

    @property
    def message_index(self) -> int:
        """The message's place among the output items: after the reasoning, when there is one."""
        return int(bool(self.reasoning))

    def call_index(self, k: int) -> int:
        """Call `k`'s place among the output items: after the reasoning and the message."""
        return self.message_index + int(self.has_message) + k

    def reasoning_item(self, status: str) -> ReasoningItem:
        return ReasoningItem(id=self.reasoning_id, status=status, content=[ReasoningText(text=self.reasoning)])

    def message(self, status: str) -> OutputMessage:
        return OutputMessage(id=self.message_id, status=status,
                             content=[OutputText(text=self.text, logprobs=self.logprobs)])

    def items(self, status: str) -> list[OutputItem]:
        return (([self.reasoning_item(status)] if self.reasoning else [])
                + ([self.message(status)] if self.has_message else [])
                + [c.model_copy(update={"status": status}) for c in self.calls])


def finished(response: ResponseObject, output: ResponseOutput, finish_reason: str | None,
             usage: ResponseUsage) -> ResponseObject:
    """The response once its choice ended (`finish_reason` "length": cut at max_output_tokens)."""
    cut = finish_reason == "length"
    status = "incomplete" if cut else "completed"
    return response.model_copy(update={
        "status": status, "output": output.items(status), "usage": usage,
        "incomplete_details": IncompleteDetails(reason="max_output_tokens") if cut else None})


def failed(response: ResponseObject, message: str) -> ResponseObject:
    """The response once an error ended it after it began."""
    return response.model_copy(update={"status": "failed", "error": ResponseError(code="server_error",
                                                                                 message=message)})


class ResponseEvents:
    """The numbered SSE events of one streamed response."""

    def __init__(self):
        self.sequence_number = 0

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence_number, **to_jsonable_python(fields)}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def open_reasoning(self, output: ResponseOutput) -> list[str]:
        return [self.event("response.output_item.added", output_index=0, item=output.reasoning_item("in_progress")
                           .model_copy(update={"content": []})),
                self.event("response.content_part.added", item_id=output.reasoning_id, output_index=0,
                           content_index=0, part=ReasoningText(text=""))]

    def reasoning_delta(self, output: ResponseOutput, text: str) -> str:
        return self.event("response.reasoning_text.delta", item_id=output.reasoning_id, output_index=0,
                          content_index=0, delta=text)

    def close_reasoning(self, output: ResponseOutput, status: str = "completed") -> list[str]:
        item = output.reasoning_item(status)
        return [self.event("response.reasoning_text.done", item_id=output.reasoning_id, output_index=0,
                           content_index=0, text=output.reasoning),
                self.event("response.content_part.done", item_id=output.reasoning_id, output_index=0,
                           content_index=0, part=item.content[0]),
                self.event("response.output_item.done", output_index=0, item=item)]

    def open_message(self, output: ResponseOutput) -> list[str]:
        index = output.message_index
        return [self.event("response.output_item.added", output_index=index, item=output.message("in_progress")
                           .model_copy(update={"content": []})),
                self.event("response.content_part.added", item_id=output.message_id, output_index=index,
                           content_index=0, part=OutputText(text="", logprobs=[] if output.logprobs is not None else None))]

    def text_delta(self, output: ResponseOutput, text: str, logprobs: list[ChatTokenLogprob]) -> str:
        return self.event("response.output_text.delta", item_id=output.message_id, output_index=output.message_index,
                          content_index=0, delta=text, logprobs=logprobs)

    def close_message(self, output: ResponseOutput, status: str) -> list[str]:
        message, index = output.message(status), output.message_index
        part = message.content[0]
        return [self.event("response.output_text.done", item_id=output.message_id, output_index=index,
                           content_index=0, text=output.text, logprobs=part.logprobs or []),
                self.event("response.content_part.done", item_id=output.message_id, output_index=index,
                           content_index=0, part=part),
                self.event("response.output_item.done", output_index=index, item=message)]

    def open_call(self, output: ResponseOutput, k: int) -> str:
        call = output.calls[k]
        return self.event("response.output_item.added", output_index=output.call_index(k),
                          item=call.model_copy(update={"arguments": "", "status": "in_progress"}))

    def call_arguments(self, output: ResponseOutput, k: int, delta: str) -> str:
        return self.event("response.function_call_arguments.delta", item_id=output.calls[k].id,
                          output_index=output.call_index(k), delta=delta)

    def close_call(self, output: ResponseOutput, k: int, status: str) -> list[str]:
        call, index = output.calls[k].model_copy(update={"status": status}), output.call_index(k)
        return [self.event("response.function_call_arguments.done", item_id=call.id, output_index=index,
                           name=call.name, arguments=call.arguments),
                self.event("response.output_item.done", output_index=index, item=call)]

    def failed(self, response: ResponseObject, message: str) -> str:
        return self.event("response.failed", response=failed(response, message))


async def guarded_events(events: ResponseEvents, response: ResponseObject, body: AsyncIterator[str],
                         close) -> AsyncIterator[str]:
    """A streamed response's events; an error after the stream began ends it with
    `response.failed`, and `close` (the choice's) runs whatever happens."""
    try:
        async for chunk in body:
            yield chunk
    except Exception as exc:  # noqa: BLE001 - the stream has started: report in-band
        yield events.failed(response, stream_failure_message(response.id, exc))
    finally:
        close()
