"""The body of a chat completion, whole or streamed: a reply's reasoning apart (with the app's
`reasoning_parser`, deployments/reasoning.py), then its tool calls or its text; a harmony reply's
messages (gpt-oss's, deployments/harmony.py) are read for all three at once.

A mixin of the Ingress deployment (deployments/ingress.py), which keeps the route itself (see
deployments/responses_route.py for why routes stay there); it uses the Ingress's tool syntax,
token names and usage.
"""

from __future__ import annotations

from functools import partial
from typing import AsyncIterator, Callable

from deployments.chat_protocol import ChatCompletionRequest
from deployments.choices import Choice, merge_choices, sse, usage_of
from deployments.custom_tools import InputStream
from deployments.harmony import HarmonyReply, guided_reply
from deployments.output_logprobs import chat_logprobs
from deployments.reasoning import ReasoningStream, reasoning_tags, thinking_then, thinks
from deployments.responses import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                   ChatCompletionResponse, ChatLogprobs, CompletionTokensDetails, DeltaMessage,
                                   UsageInfo)
from deployments.tool_call_stream import HarmonyCallStream, ToolStream, call_stream
from deployments.tool_protocol import (CustomCallDelta, CustomToolCallDelta, FunctionCallDelta, ToolCall, ToolCallDelta,
                                       ToolDefinition)
from deployments.written_call import CallPiece


class ChatRoutes:
    def _thinks(self, body: ChatCompletionRequest) -> bool:
        return thinks(self.reasoning_parser, body.template_variables)

    def _reasoning_stream(self, thinking: bool) -> ReasoningStream | HarmonyReply:
        """The reader that splits a reply's reasoning from its answer."""
        if self.tool_syntax.harmony:
            return HarmonyReply()
        return ReasoningStream(thinking, self.tokenizer.decode, reasoning_tags(self.reasoning_parser))

    def _call_stream(self, split: ReasoningStream | HarmonyReply,
                     tools: list[ToolDefinition] | None) -> ToolStream | HarmonyCallStream:
        """The reader of the calls in the answer that `split` gives (or of a harmony reply's, its own)."""
        return call_stream(self.tool_syntax, tools, split if isinstance(split, HarmonyReply) else None)

    def _guided_whole(self, calls: bool, thinking: bool) -> Callable[[str], str] | None:
        """Where a guided format (`calls`: the tool calls') sits in the whole output: in a harmony
        reply's messages (the calls' regex holds their own headers), after the reasoning, or alone."""
        if self.tool_syntax.harmony:
            return None if calls else guided_reply
        return partial(thinking_then, tags=reasoning_tags(self.reasoning_parser)) if thinking else None

    def _chat_message(self, body: ChatCompletionRequest, reasoning: str, text: str, thinking: bool,
                      calls: list[ToolCall] | None = None) -> AssistantMessage:
        """A whole reply from its reasoning, its text (before its tool calls, if any) and its calls."""
        written = body.echoed_text + text
        calls = [body.as_reply_call(c) for c in calls] if calls else calls
        return AssistantMessage(content=(written or None) if calls or reasoning else written, tool_calls=calls,
                                reasoning=reasoning if thinking and body.include_reasoning else None)

    def _with_reasoning(self, usage: UsageInfo | None, splits: list[ReasoningStream]) -> UsageInfo | None:
        """OpenAI's `completion_tokens_details.reasoning_tokens`, when the app has a reasoning parser
        (0 for a reply with thinking off)."""
        if usage is None or self.reasoning_parser is None:
            return usage
        details = (usage.completion_tokens_details or CompletionTokensDetails()).model_copy(
            update={"reasoning_tokens": sum(s.reasoning_tokens for s in splits)})
        return usage.model_copy(update={"completion_tokens_details": details})

    async def _whole_chat(self, request_id: str, created: int, body: ChatCompletionRequest,
                          choices: list[Choice], calls_possible: bool, thinking: bool) -> ChatCompletionResponse:
        splits = {c.index: self._reasoning_stream(thinking) for c in choices}
        streams = {i: self._call_stream(split, body.tools) for i, split in splits.items()} if calls_possible else {}
        reasoning, answers = {c.index: "" for c in choices}, {c.index: "" for c in choices}
        calls: dict[int, list[ToolCall] | None] = {c.index: None for c in choices}
        logprobs: dict[int, list] = {c.index: [] for c in choices}
        async for event in merge_choices(choices):
            i = event.choice.index
            more_reasoning, more_answer = splits[i].take(event.text, event.finish_reason is not None,
                                                         event.token_ids)
            if i in streams:  # what its stream would send: the same reader
                more_answer, _ = streams[i].feed(more_answer)
                if event.finish_reason is not None:
                    held, calls[i] = streams[i].finish()
                    more_answer += held
            reasoning[i] += more_reasoning
            answers[i] += more_answer
            lp = chat_logprobs(event.logprobs, self._token_names(body))
            if lp is not None:
                logprobs[i].extend(lp.content)
        out = []
        for c in choices:
            message = self._chat_message(body, reasoning[c.index], answers[c.index], thinking, calls[c.index])
            out.append(ChatChoice(
                index=c.index, message=message,
                logprobs=ChatLogprobs(content=logprobs[c.index]) if body.logprobs else None,
                finish_reason="tool_calls" if message.tool_calls and c.finish_reason == "stop" else c.finish_reason,
                stop_reason=c.stop_reason))
        usage = self._with_reasoning(usage_of(choices), list(splits.values()))
        return ChatCompletionResponse(id=request_id, created=created, model=self.model_name, usage=usage, choices=out)

    @staticmethod
    def _call_delta(body: ChatCompletionRequest, stream: ToolStream | HarmonyCallStream, piece: CallPiece,
                    inputs: dict[int, InputStream]) -> ToolCallDelta | CustomToolCallDelta:
        """OpenAI's shape: a call's first delta has its id, type and name; a custom tool's call gives
        its input as it grows (`inputs`: the choice's custom calls' input streams, by call index)."""
        call = stream.call(piece.index)
        name = call.function.name
        if body.calls_custom_tool(name):
            more = inputs.setdefault(piece.index, InputStream()).feed(piece.arguments)
            if not piece.opens:
                return CustomToolCallDelta(index=piece.index, custom=CustomCallDelta(input=more))
            return CustomToolCallDelta(index=piece.index, id=call.id, type="custom",
                                       custom=CustomCallDelta(name=name, input=more))
        if not piece.opens:
            return ToolCallDelta(index=piece.index, function=FunctionCallDelta(arguments=piece.arguments))
        return ToolCallDelta(index=piece.index, id=call.id, type="function",
                             function=FunctionCallDelta(name=name, arguments=piece.arguments))

    async def _stream_chat(self, request_id: str, created: int, body: ChatCompletionRequest,
                           choices: list[Choice], calls_possible: bool, thinking: bool) -> AsyncIterator[str]:
        def chunk(choice_list, usage=None) -> str:
            indices = {c.index for c in choice_list}
            usage = usage or self._with_reasoning(self._chunk_usage(body, choices, indices),
                                                  [splits[i] for i in indices])
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                            choices=choice_list, usage=usage))

        splits = {c.index: self._reasoning_stream(thinking) for c in choices}
        streams = {i: self._call_stream(split, body.tools) for i, split in splits.items()} if calls_possible else {}
        inputs: dict[int, dict[int, InputStream]] = {i: {} for i in streams}  # custom calls' inputs by choice
        yield chunk([ChatChunkChoice(index=c.index, delta=DeltaMessage(role="assistant", content=""))
                     for c in choices])
        if body.echoed_text:
            yield chunk([ChatChunkChoice(index=c.index, delta=DeltaMessage(content=body.echoed_text))
                         for c in choices])
        async for event in merge_choices(choices):
            i, finish = event.choice.index, event.finish_reason
            reasoning, text = splits[i].take(event.text, finish is not None, event.token_ids)
            reasoning = reasoning if body.include_reasoning else ""
            pieces, calls = [], None
            if i in streams:
                text, pieces = streams[i].feed(text)
                if finish is not None:
                    held, calls = streams[i].finish()
                    text += held
            if not text and not reasoning and not pieces and finish is None and not event.logprobs:
                continue  # held: maybe the start of a call or of a tag
            deltas = [self._call_delta(body, streams[i], p, inputs[i]) for p in pieces]
            logprobs = chat_logprobs(event.logprobs, self._token_names(body))
            if len(deltas) > 1:  # one call's delta a chunk, as OpenAI and vLLM send them (some
                # clients read only the first): the event's text goes with the first, its finish with the last
                for delta in deltas[:-1]:
                    yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(
                        content=text or None, reasoning=reasoning or None, tool_calls=[delta]), logprobs=logprobs)])
                    text, reasoning, logprobs = "", "", None
                deltas = deltas[-1:]
            yield chunk([ChatChunkChoice(
                index=i, delta=DeltaMessage(content=text or None, reasoning=reasoning or None, tool_calls=deltas or None),
                logprobs=logprobs,
                finish_reason="tool_calls" if calls and finish == "stop" else finish, stop_reason=event.stop_reason)])
        if body.include_usage:
            yield chunk([], self._with_reasoning(usage_of(choices), list(splits.values())))
