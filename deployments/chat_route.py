"""The body of a chat completion, whole or streamed: a reply's reasoning apart (with the app's
`reasoning_parser`, deployments/reasoning.py), then its tool calls or its text.

A mixin of the Ingress deployment (deployments/ingress.py), which keeps the route itself (see
deployments/responses_route.py for why routes stay there); it uses the Ingress's tool syntax,
token names and usage.
"""

from __future__ import annotations

from typing import AsyncIterator

from deployments.choices import Choice, merge_choices, sse, usage_of
from deployments.output_logprobs import chat_logprobs
from deployments.protocol import ChatCompletionRequest
from deployments.reasoning import ReasoningStream, split_reasoning, thinks
from deployments.responses import AssistantMessage, ChatChunkChoice, ChatCompletionChunk, DeltaMessage
from deployments.tool_call_stream import CallPiece, ToolStream, parse_calls
from deployments.tool_protocol import FunctionCallDelta, ToolCallDelta


class ChatRoutes:
    def _thinks(self, body: ChatCompletionRequest) -> bool:
        return thinks(self.reasoning_parser, body.chat_template_kwargs)

    def _chat_message(self, body: ChatCompletionRequest, output: str, thinking: bool,
                      calls_possible: bool = False) -> AssistantMessage:
        """A whole reply: its reasoning apart, then its tool calls, or else its text."""
        reasoning, text = split_reasoning(output, thinking)
        calls = parse_calls(text, self.tool_syntax) if calls_possible else None
        return AssistantMessage(content=None if calls or (reasoning and not text) else body.echoed_text + text,
                                tool_calls=calls, reasoning=reasoning if thinking and body.include_reasoning else None)

    @staticmethod
    def _call_delta(stream: ToolStream, piece: CallPiece) -> ToolCallDelta:
        """OpenAI's shape: a call's first delta has its id, type and name."""
        call = stream.call(piece.index) if piece.opens else None
        return ToolCallDelta(index=piece.index, id=call and call.id, type=call and "function",
                             function=FunctionCallDelta(name=call and call.function.name, arguments=piece.arguments))

    async def _stream_chat(self, request_id: str, created: int, body: ChatCompletionRequest,
                           choices: list[Choice], calls_possible: bool, thinking: bool) -> AsyncIterator[str]:
        def chunk(choice_list, usage=None) -> str:
            usage = usage or self._chunk_usage(body, choices, {c.index for c in choice_list})
            return sse(ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                            choices=choice_list, usage=usage))

        streams = {c.index: ToolStream(self.tool_syntax) for c in choices} if calls_possible else {}
        yield chunk([ChatChunkChoice(index=c.index, delta=DeltaMessage(role="assistant", content=""))
                     for c in choices])
        if body.echoed_text:
            yield chunk([ChatChunkChoice(index=c.index, delta=DeltaMessage(content=body.echoed_text))
                         for c in choices])
        splits = {c.index: ReasoningStream(thinking) for c in choices}
        async for event in merge_choices(choices):
            i, finish = event.choice.index, event.finish_reason
            reasoning, text = splits[i].take(event.text, last=finish is not None)
            reasoning = reasoning if body.include_reasoning else ""
            pieces, calls = [], None
            if i in streams:
                text, pieces = streams[i].feed(text)
                if finish is not None:
                    held, calls = streams[i].finish()
                    text += held
            if not text and not reasoning and not pieces and finish is None and not event.logprobs:
                continue  # held: maybe the start of a call or of a tag
            deltas = [self._call_delta(streams[i], p) for p in pieces]
            yield chunk([ChatChunkChoice(
                index=i, delta=DeltaMessage(content=text or None, reasoning=reasoning or None, tool_calls=deltas or None),
                logprobs=chat_logprobs(event.logprobs, self._token_names(body)),
                finish_reason="tool_calls" if calls and finish == "stop" else finish, stop_reason=event.stop_reason)])
        if body.include_usage:
            yield chunk([], usage_of(choices))
