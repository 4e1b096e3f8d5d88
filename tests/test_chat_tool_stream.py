"""A streamed chat reply's tool calls go out one call's delta a chunk, however many calls one
engine step wrote, as OpenAI and vLLM send them: some clients read only `tool_calls[0]`."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from deployments.chat_protocol import ChatCompletionRequest
from deployments.chat_route import ChatRoutes
from deployments.choices import Choice
from deployments.detokenizer import IncrementalDetokenizer
from deployments.tool_calls import PLAIN
from tests.test_choices import output
from tests.test_detokenizer import ByteTokenizer

NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}


class Routes(ChatRoutes):
    """The chat routes with what they use of the Ingress."""
    tool_syntax, reasoning_parser, model_name = PLAIN, None, "m"

    def __init__(self):
        self.tokenizer = ByteTokenizer()

    def _token_names(self, body):
        return str

    def _chunk_usage(self, body, choices, indices):
        return None


async def steps(outputs):
    for out in outputs:
        yield out


async def chunks(routes: Routes, body: ChatCompletionRequest, choice: Choice, thinking: bool = False) -> list[dict]:
    return [json.loads(sse.removeprefix("data: ")) async for sse in
            routes._stream_chat("chatcmpl-1", 0, body, [choice], True, thinking) if sse.startswith("data: {")]


def test_two_calls_written_in_one_step_go_out_in_two_chunks():
    tok = ByteTokenizer()
    text = PLAIN.render([("now", {}), ("now", {"a": 1})])
    second_name_end = text.index('"now"', text.index("\n")) + len('"now"')
    ids = tok.encode(text)
    outputs = [output(ids[:second_name_end], second_name_end),  # call 0 whole, call 1 opened
               output(ids[second_name_end:] + [tok.EOS], len(ids) + 1, finished=True)]
    choice = Choice(0, 0, [], stream=steps(outputs), detok=IncrementalDetokenizer(tok),
                    timer=SimpleNamespace(on_tokens=lambda n: None, on_finish=lambda *args: None))
    body = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[NOW], stream=True)
    sent = asyncio.run(chunks(Routes(), body, choice))
    deltas = [c["choices"][0]["delta"].get("tool_calls") or [] for c in sent]
    assert [len(d) for d in deltas] == [0, 1, 1, 1]  # the role, call 0, call 1 opened, its arguments
    calls: dict[int, list[str]] = {}
    for [delta] in deltas[1:]:
        name, arguments = calls.setdefault(delta["index"], ["", ""])
        calls[delta["index"]] = [name + (delta["function"].get("name") or ""),
                                 arguments + delta["function"]["arguments"]]
    assert calls == {0: ["now", "{}"], 1: ["now", '{"a": 1}']}
    assert [c["choices"][0]["finish_reason"] for c in sent] == [None, None, None, "tool_calls"]
