"""A Responses API answer, built from the one chat choice the ingress ran for it: whole, or as
the stream of events OpenAI sends (`response.created`, ..., `response.completed`).

Output items come in the order the model wrote them: reasoning (a thinking model's, with the app's
`reasoning_parser`), messages (text), and one `function_call` item per call (`custom_tool_call` for a
custom tool's, with its input). A thinking model
reasons, then answers; a harmony reply (gpt-oss's) may write more: an analysis, a preamble, more
analysis, then a call is four items. An output with no item is an empty message.
An output cut at `max_output_tokens` makes the response `incomplete` with that reason, as
OpenAI reports it.

The stream: `response.created` and `response.in_progress`; then each item as it is written: a
reasoning item, its part and its `response.reasoning_text.delta`s; a message item and its text part
opened when its first text is known not to open a call (deployments/tool_call_stream.py:
ToolStream), then `response.output_text.delta` per step; a call as an item opened once its name is
known, its arguments as `response.function_call_arguments.delta`s as they are written (a custom
call's input as `response.custom_tool_call_input.delta`s). An item is
done when the next begins or the output ends; then `response.completed` (or `response.incomplete`)
with the whole response. Every event has its `sequence_number`. An error after the stream began
ends it with `response.failed`.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from pydantic_core import to_jsonable_python

from deployments.choices import Event, stream_failure_message
from deployments.custom_tools import InputStream
from deployments.harmony import HarmonyReply
from deployments.reasoning import ReasoningStream
from deployments.request_ids import new_id
from deployments.responses import ChatTokenLogprob
from deployments.responses_api_protocol import (CustomToolCallItem, FunctionToolCall, IncompleteDetails, OutputItem,
                                                OutputMessage, OutputText, ReasoningItem, ReasoningText,
                                                ResponseError, ResponseObject, ResponseUsage)
from deployments.tool_protocol import ToolCall


class ResponseOutput:
    """The output of one response as it grows: its items in the order the model wrote them, the last
    one still being written until another begins or the output ends."""

    def __init__(self, with_logprobs: bool, reasoning_stream: ReasoningStream | HarmonyReply | None = None):
        """`reasoning_stream`: how the output splits into reasoning and answer (all answer without)."""
        self.reasoning_stream = reasoning_stream or ReasoningStream(thinking=False)
        self.with_logprobs = with_logprobs
        self.written: list[OutputItem] = []
        self.call_places: list[int] = []  # the calls' places among them, as the call stream numbers the calls
        self.custom_inputs: dict[int, InputStream] = {}  # the custom calls' inputs, by their places
        self.writing = False  # the last item is not yet done

    def split(self, event: Event) -> tuple[str, str]:
        """An event's (reasoning, answer) text."""
        return self.reasoning_stream.take(event.text, event.finish_reason is not None, event.token_ids)

    @property
    def reasoning_tokens(self) -> int:
        return self.reasoning_stream.reasoning_tokens

    def writing_a(self, kind: type) -> bool:
        return self.writing and isinstance(self.written[-1], kind)

    def items(self, status: str) -> list[OutputItem]:
        return [item.model_copy(update={"status": status}) for item in self.written]


def response_status(finish_reason: str | None) -> str:
    """A response cut at max_output_tokens (finish_reason "length") is incomplete."""
    return "incomplete" if finish_reason == "length" else "completed"


def finished(response: ResponseObject, output: ResponseOutput, finish_reason: str | None,
             usage: ResponseUsage) -> ResponseObject:
    """The response once its choice ended and its output was written (ResponseEvents.finish)."""
    status = response_status(finish_reason)
    return response.model_copy(update={
        "status": status, "output": output.items(status), "usage": usage,
        "incomplete_details": IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None})


def failed(response: ResponseObject, message: str) -> ResponseObject:
    """The response once an error ended it after it began."""
    return response.model_copy(update={"status": "failed", "error": ResponseError(code="server_error",
                                                                                 message=message)})


class ResponseEvents:
    """The numbered SSE events of one streamed response; each writing method adds to its output too.
    An item of another kind than the one being written (reasoning after text, text after a call)
    closes that one and opens a new item after it."""

    def __init__(self):
        self.sequence_number = 0

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence_number, **to_jsonable_python(fields)}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def reasoning(self, output: ResponseOutput, text: str) -> list[str]:
        out = [] if output.writing_a(ReasoningItem) else self._begin(
            output, ReasoningItem(id=new_id("rs", "_"), status="in_progress", content=[ReasoningText(text="")]))
        item = output.written[-1]
        item.content[0].text += text
        return out + [self.event("response.reasoning_text.delta", item_id=item.id, output_index=len(output.written) - 1,
                                 content_index=0, delta=text)]

    def text(self, output: ResponseOutput, text: str, logprobs: list[ChatTokenLogprob]) -> list[str]:
        out = [] if output.writing_a(OutputMessage) else self._begin_message(output)
        part = output.written[-1].content[0]
        part.text += text
        if part.logprobs is not None:
            part.logprobs.extend(logprobs)
        return out + [self.event("response.output_text.delta", item_id=output.written[-1].id,
                                 output_index=len(output.written) - 1, content_index=0, delta=text,
                                 logprobs=logprobs)]

    def call(self, output: ResponseOutput, call: ToolCall, custom: bool = False) -> list[str]:
        """A call whose name is known (`custom`: a custom tool's); its arguments follow (`call_arguments`)."""
        number = call.id.removeprefix("call_")
        output.call_places.append(len(output.written))
        if custom:
            output.custom_inputs[len(output.written)] = InputStream()
            return self._begin(output, CustomToolCallItem(id=f"ctc_{number}", call_id=call.id, name=call.function.name,
                                                          input="", status="in_progress"))
        return self._begin(output, FunctionToolCall(id=f"fc_{number}", call_id=call.id, name=call.function.name,
                                                    arguments="", status="in_progress"))

    def call_arguments(self, output: ResponseOutput, k: int, delta: str) -> list[str]:
        index = output.call_places[k]
        call = output.written[index]
        if isinstance(call, CustomToolCallItem):
            more = output.custom_inputs[index].feed(delta)
            call.input += more
            return [self.event("response.custom_tool_call_input.delta", item_id=call.id, output_index=index,
                               delta=more)] if more else []
        call.arguments += delta
        return [self.event("response.function_call_arguments.delta", item_id=call.id, output_index=index,
                           delta=delta)]

    def finish(self, output: ResponseOutput, status: str, logprobs: list[ChatTokenLogprob]) -> list[str]:
        """The end of the output (`logprobs`: of tokens that wrote no text, for its message): the last
        item is done; an output with no item is an empty message."""
        out = [] if output.written else self._begin_message(output)
        if logprobs and output.writing_a(OutputMessage) and output.written[-1].content[0].logprobs is not None:
            output.written[-1].content[0].logprobs.extend(logprobs)
        return out + self._end(output, status)

    def failed(self, response: ResponseObject, message: str) -> str:
        return self.event("response.failed", response=failed(response, message))

    def _begin_message(self, output: ResponseOutput) -> list[str]:
        part = OutputText(text="", logprobs=[] if output.with_logprobs else None)
        return self._begin(output, OutputMessage(id=new_id("msg", "_"), status="in_progress", content=[part]))

    def _begin(self, output: ResponseOutput, item: OutputItem) -> list[str]:
        out = self._end(output, "completed")
        output.written.append(item)
        output.writing = True
        index = len(output.written) - 1
        if isinstance(item, (FunctionToolCall, CustomToolCallItem)):
            return out + [self.event("response.output_item.added", output_index=index, item=item)]
        return out + [self.event("response.output_item.added", output_index=index,
                                 item=item.model_copy(update={"content": []})),
                      self.event("response.content_part.added", item_id=item.id, output_index=index,
                                 content_index=0, part=item.content[0].model_copy(deep=True))]

    def _end(self, output: ResponseOutput, status: str) -> list[str]:
        if not output.writing:
            return []
        output.writing = False
        index = len(output.written) - 1
        item = output.written[index]
        item.status = status
        if isinstance(item, FunctionToolCall):
            return [self.event("response.function_call_arguments.done", item_id=item.id, output_index=index,
                               name=item.name, arguments=item.arguments),
                    self.event("response.output_item.done", output_index=index, item=item)]
        if isinstance(item, CustomToolCallItem):
            return [self.event("response.custom_tool_call_input.done", item_id=item.id, output_index=index,
                               input=item.input),
                    self.event("response.output_item.done", output_index=index, item=item)]
        part = item.content[0]
        done = ("response.reasoning_text.done", {}) if isinstance(item, ReasoningItem) else \
            ("response.output_text.done", {"logprobs": part.logprobs or []})
        return [self.event(done[0], item_id=item.id, output_index=index, content_index=0, text=part.text, **done[1]),
                self.event("response.content_part.done", item_id=item.id, output_index=index, content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=index, item=item)]


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
