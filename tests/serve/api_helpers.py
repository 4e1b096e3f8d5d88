"""What the served API tests share: prompts, the engine alone configured as the app's target
replica (to hold the app's output to), waits on the replica's KV blocks, and the default
tokenizer's ids for the apps that serve a model writing a known text, and a streamed chat
reply assembled as a client assembles it."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import pytest
import requests

PROMPTS = ["The quick brown fox", "def main():\n    return", "héllo wörld 日本"]


@pytest.fixture(scope="module")
def engine(serve_app):
    """The engine alone, configured as the app's target replica is."""
    from deployments.builder import engine_config
    from deployments.app_args import AppArgs
    from app.engine.engine import LLMEngine

    args = AppArgs.model_validate(serve_app.args)
    return LLMEngine(engine_config(args, str(serve_app.checkpoint), "cpu"))


def engine_text(engine, tokenizer, prompt_ids: list[int], max_tokens: int) -> tuple[str, int]:
    from app.sampling_params import SamplingParams

    [ids] = engine.generate([prompt_ids], SamplingParams(max_tokens=max_tokens, temperature=0))
    return tokenizer.decode(ids, skip_special_tokens=True), len(ids)


def chat_ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def streamed_response(client, delta_type: str, **kwargs) -> tuple[list[str], list[str], object]:
    """A Responses answer streamed through the client's `responses.stream`: the event types, the
    deltas of the `delta_type` events, and the last event's response (`response.completed`, or
    `response.incomplete` when cut)."""
    kinds, deltas = [], []
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == delta_type:
                deltas.append(event.delta)
    return kinds, deltas, event.response


@dataclass
class StreamedChat:
    """A streamed chat reply of one choice, assembled: its text, reasoning and calls (by index:
    id, name, arguments), what each delta carried in order ("reasoning", "content", "call"), the
    deltas that carried arguments, and the last chunk (usage)."""
    content: str = ""
    reasoning: str = ""
    calls: dict[int, dict] = field(default_factory=dict)
    kinds: list[str] = field(default_factory=list)
    argument_deltas: int = 0
    finish_reason: str | None = None
    last_chunk: object = None

    @property
    def call_list(self) -> list[tuple[str, str]]:
        return [(self.calls[i]["name"], self.calls[i]["arguments"]) for i in sorted(self.calls)]


def streamed_chat(chunks) -> StreamedChat:
    out = StreamedChat()
    for out.last_chunk in chunks:
        for choice in out.last_chunk.choices:
            delta, out.finish_reason = choice.delta, choice.finish_reason or out.finish_reason
            if getattr(delta, "reasoning", None):
                out.kinds.append("reasoning")
                out.reasoning += delta.reasoning
            if delta.content:
                out.kinds.append("content")
                out.content += delta.content
            for piece in delta.tool_calls or []:
                out.kinds.append("call")
                call = out.calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
                out.argument_deltas += bool(piece.function.arguments)
    return out


def max_model_len(serve_app) -> int:
    models = requests.get(serve_app.base_url + "/models", timeout=30).json()
    return models["data"][0]["max_model_len"]


def wait_for_free_kv(serve_app, timeout_s: float = 30.0) -> dict:
    handle = serve_app.target_handle()
    deadline = time.monotonic() + timeout_s
    while True:
        stats = handle.stats.remote().result()
        if stats["num_blocks_used"] == 0 and stats["num_requests_running"] == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"KV blocks still in use after {timeout_s}s: {stats}")
        time.sleep(0.2)


@functools.cache
def default_tokenizer():
    from transformers import AutoTokenizer

    from tests.checkpoints import DEFAULT_TARGET

    return AutoTokenizer.from_pretrained(DEFAULT_TARGET)


def token_ids(text: str) -> list[int]:
    """`text`'s ids in the default tokenizer (that of tests/checkpoints.py: write_successor_model's
    models), without special tokens."""
    return default_tokenizer().encode(text, add_special_tokens=False)
