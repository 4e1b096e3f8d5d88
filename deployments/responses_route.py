"""OpenAI's Responses API (`POST /v1/responses`), answered as the chat completion it describes
(deployments/responses_api_input.py), whole or as its stream of events
(deployments/responses_api_output.py), or in the background (deployments/responses_background.py).
A response is stored (deployments/response_store.py) with the items it answered
(deployments/response_items.py) when the request's `store` is true and the app keeps responses,
for `previous_response_id`, GET and `input_items`.

A mixin of the Ingress deployment (deployments/ingress.py): it uses the Ingress's model check,
chat prompt, engine requests (`_start`) and usage. The routes themselves stay on the Ingress: a
route on a method of an importable class reaches the replica by reference (cloudpickle imports
it anew there), without the `self` binding Serve gave it in the driver, and FastAPI then asks
the client for `self`.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from deployments.choices import Choice, Event, merge_choices, usage_of
from deployments.guided_formats import FormatRequestError
from deployments.openai_errors import OpenAIError
from deployments.output_logprobs import chat_logprobs
from deployments.response_store import StoredResponse, not_kept
from deployments.response_items import item_page, referenced_ids, request_items, resolved
from deployments.responses_api_input import as_responses_error, chat_request
from deployments.responses_background import BackgroundRuns, check_background, outside_the_http_request
from deployments.request_ids import response_ids
from deployments.responses_api_output import (ResponseEvents, ResponseOutput, finished, guarded_events,
                                              response_status)
from deployments.responses_api_protocol import (InputTokensDetails, OutputTokensDetails, ResponseObject,
                                                ResponsesRequest, ResponseUsage)
from deployments.responses_truncation import truncated_to_fit
from deployments.tool_call_stream import HarmonyCallStream, ToolStream
from deployments.written_call import CallPiece
from deployments.tool_calls import requested_tool_format
from deployments.tool_protocol import ToolDefinition

logger = logging.getLogger("ray.serve")


class ResponsesRoutes(BackgroundRuns):
    async def _create_response(self, body: ResponsesRequest, client_request_id: str | None):
        self._check_model(body.model)
        if body.ignored_fields:
            logger.warning("a response request: this server does not read the fields %s; they were ignored",
                           ", ".join(body.ignored_fields))
        response_id, engine_ids = response_ids("resp", client_request_id, "_")
        try:
            if body.background:
                check_background(body, self.response_store is not None)
            history = await self._history(body.previous_response_id)
            body = await self._with_referenced_items(body)
            chat = chat_request(body, history).with_defaults(self.defaults.sampling)
            tools = requested_tool_format(chat, self.tool_syntax)
            thinking = self._thinks(chat)
            if body.truncation == "auto":
                seen, prompt = truncated_to_fit(chat, self._chat_prompt,
                                                self.max_model_len - (chat.max_new_tokens or 1))
            else:
                seen, prompt = chat, self._chat_prompt(chat)
            with outside_the_http_request() if body.background else nullcontext():
                [choice] = await self._start(engine_ids, [prompt], seen, seen.max_new_tokens, seen.num_logprobs,
                                             "input", tools, thinking=thinking)
        except FormatRequestError as exc:
            raise as_responses_error(OpenAIError(400, str(exc), param=exc.param)) from None
        except OpenAIError as exc:
            raise as_responses_error(exc) from None
        response = ResponseObject(
            id=response_id, model=self.model_name, instructions=body.instructions,
            max_output_tokens=body.max_output_tokens, parallel_tool_calls=body.parallel_tool_calls,
            temperature=chat.temperature, top_p=chat.top_p, top_logprobs=body.top_logprobs,
            tool_choice=body.tool_choice or "auto", tools=body.tools or [], metadata=body.metadata or {},
            user=body.user, text=body.text.model_dump(by_alias=True, exclude_none=True) if body.text else
            {"format": {"type": "text"}}, store=body.store and self.response_store is not None,
            previous_response_id=body.previous_response_id, truncation=body.truncation or "disabled",
            reasoning=body.reasoning, background=body.background)
        output = ResponseOutput(body.wants_logprobs, self._reasoning_stream(thinking))
        names = self._token_names(chat)
        input_items = history + request_items(body.input) if response.store else None  # None: not kept
        events = ResponseEvents()
        call_tools = chat.tools if tools is not None else None
        stream = self._response_events(events, response, output, choice, call_tools, names, input_items,
                                       chat.calls_custom_tool)
        if body.background:
            return await self._run_in_background(response, input_items, stream, choice,
                                                 events if body.stream else None)
        if body.stream:
            return StreamingResponse(guarded_events(events, response, stream, choice.close),
                                     media_type="text/event-stream")
        async for _ in stream:  # a whole response is what its stream ends with
            pass
        return finished(response, output, choice.finish_reason, self._response_usage(choice, output))

    async def _history(self, previous_response_id: str | None) -> list[dict]:
        """The items a request continues: its previous response's input and output."""
        if previous_response_id is None:
            return []
        if self.response_store is None:
            raise OpenAIError(400, "previous_response_id: this server keeps no responses (max_stored_responses "
                                   "is 0); send the whole conversation in `input`", param="previous_response_id")
        stored = await self.response_store.get.remote(previous_response_id)
        if stored is None:
            raise OpenAIError(400, f"Previous response with id {previous_response_id!r} not found: it was never "
                                   "stored, was deleted, or is older than the newest this server keeps",
                              param="previous_response_id", code="previous_response_not_found")
        return stored.conversation

    async def _with_referenced_items(self, body: ResponsesRequest) -> ResponsesRequest:
        """`body` with the kept items its `item_reference`s name in their places."""
        ids = referenced_ids(body.input)
        if not ids:
            return body
        if self.response_store is None:
            raise OpenAIError(400, "input: an item_reference names an item of a kept response, and this server "
                                   "keeps none (max_stored_responses is 0); send the item itself", param="input")
        found = await self.response_store.items.remote(ids)
        return body.model_copy(update={"input": resolved(body.input, found)})

    async def _stored(self, response_id: str) -> StoredResponse:
        stored = await self.response_store.get.remote(response_id) if self.response_store is not None else None
        if stored is None:
            raise not_kept(response_id)
        return stored

    async def _delete_stored(self, response_id: str) -> None:
        if self.response_store is None or not await self.response_store.delete.remote(response_id):
            raise not_kept(response_id)

    async def _input_items(self, response_id: str, after: str | None, limit: int, order: str) -> dict:
        return item_page((await self._stored(response_id)).input_items, after, limit, order)

    @staticmethod
    def _output_logprobs(output: ResponseOutput, event: Event, names: Callable[[int], str]) -> list:
        if not output.with_logprobs or not event.logprobs:
            return []
        return chat_logprobs(event.logprobs, names).content

    def _response_usage(self, choice: Choice, output: ResponseOutput) -> ResponseUsage:
        usage = usage_of([choice])
        return ResponseUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                             total_tokens=usage.total_tokens, input_tokens_details=InputTokensDetails(
                                 cached_tokens=usage.prompt_tokens_details.cached_tokens),
                             output_tokens_details=OutputTokensDetails(reasoning_tokens=output.reasoning_tokens))

    async def _response_events(self, events: ResponseEvents, response: ResponseObject, output: ResponseOutput,
                               choice: Choice, call_tools: list[ToolDefinition] | None, names: Callable[[int], str],
                               input_items: list[dict] | None, custom: Callable[[str], bool]) -> AsyncIterator[str]:
        """The response's events as its output grows, its items in the order they are written.
        `input_items`: the request's, when the response is to be kept; `custom`: whether a name is a
        custom tool's."""
        yield events.event("response.created", response=response)
        yield events.event("response.in_progress", response=response)
        calls = self._call_stream(output.reasoning_stream, call_tools) if call_tools is not None else None
        held_logprobs = []
        async for event in merge_choices([choice]):
            reasoning, text = output.split(event)
            held_logprobs += self._output_logprobs(output, event, names)
            for e in events.reasoning(output, reasoning) if reasoning else []:
                yield e
            pieces = []
            if calls is not None:
                text, pieces = calls.feed(text)
                if event.finish_reason is not None:
                    held, _ = calls.finish()
                    text += held
            if text:
                for e in events.text(output, text, held_logprobs):
                    yield e
                held_logprobs = []
            for piece in pieces:  # a call's tokens' logprobs have no place in the output
                for e in self._call_events(events, output, calls, piece, custom):
                    yield e
        for e in events.finish(output, response_status(choice.finish_reason), held_logprobs):
            yield e
        final = finished(response, output, choice.finish_reason, self._response_usage(choice, output))
        if input_items is not None:  # before the last event: a client may continue it at once
            await self.response_store.put.remote(StoredResponse(final, input_items))
        yield events.event(f"response.{final.status}", response=final)

    @staticmethod
    def _call_events(events: ResponseEvents, output: ResponseOutput, calls: ToolStream | HarmonyCallStream,
                     piece: CallPiece, custom: Callable[[str], bool]) -> list[str]:
        """A call's piece as events."""
        call = calls.call(piece.index)
        out = events.call(output, call, custom(call.function.name)) if piece.opens else []
        if piece.arguments:
            out += events.call_arguments(output, piece.index, piece.arguments)
        return out
