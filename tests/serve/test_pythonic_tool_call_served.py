"""Pythonic tool calls, served: a model whose chat template teaches Llama 3.2's pythonic calls
(vLLM's pythonic templates: `[func_name1(params_name1=params_value1, ...)]`) writes its call as a
Python list, `[now(zone="UTC", local=True)]`, and the reply carries OpenAI's JSON arguments, as
vLLM's `pythonic` parser gives them; a call fed back is written in Python again.

The app serves a model that writes a known text (tests/checkpoints.py: write_successor_model):
greedy, it writes `[` and the call grammar writes the rest, a call of the one tool."""

from __future__ import annotations

import ast
import json

import jsonschema
import pytest
import requests

from transformers import AutoTokenizer

from tests.checkpoints import DEFAULT_TARGET, write_successor_model
from tests.serve.api_helpers import streamed_chat
from tests.serve.test_text_then_tool_call_served import CHAT_TEMPLATE, NOW, PARAMETERS

pytestmark = pytest.mark.slow

SERVE_APP_ARGS = {"draft_model": None, "speculative_method": None}
# vLLM's pythonic templates teach the call in these words
CALL_FORM = "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    written = tokenizer.encode("<|assistant|>\n")[-1:] + tokenizer.encode("[")
    path = write_successor_model(tmp_path_factory.mktemp("pythonic"), DEFAULT_TARGET,
                                 dict(zip(written, written[1:])), CHAT_TEMPLATE.replace("CALL_FORM", CALL_FORM))
    return path, path


def request(model: str, **kwargs) -> dict:
    return dict(model=model, messages=[{"role": "user", "content": "What time is it?"}], tools=[NOW],
                tool_choice="auto", parallel_tool_calls=False, temperature=0, max_tokens=64, **kwargs)


def test_the_call_is_written_in_python_and_replied_as_json(serve_app, client):
    choice = client.chat.completions.create(**request(serve_app.model, logprobs=True)).choices[0]
    written = "".join(t.token for t in choice.logprobs.content)  # the call as the model wrote it
    [python_call] = ast.parse(written, mode="eval").body.elts
    assert written.startswith("[now(zone=") and python_call.func.id == "now"
    assert {"True", "False"} & {ast.unparse(k.value) for k in python_call.keywords}  # Python's spelling
    assert (choice.message.content, choice.finish_reason) == (None, "tool_calls")
    [call] = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, PARAMETERS)
    assert arguments == {k.arg: ast.literal_eval(k.value) for k in python_call.keywords}
    assert call.function.name == "now" and call.id.startswith("call_")


def test_the_stream_assembles_the_whole_reply(serve_app, client):
    whole = client.chat.completions.create(**request(serve_app.model)).choices[0].message.tool_calls[0]
    streamed = streamed_chat(client.chat.completions.create(**request(serve_app.model), stream=True))
    assert (streamed.content, streamed.finish_reason) == ("", "tool_calls")
    assert streamed.call_list == [("now", whole.function.arguments)]


def test_a_call_fed_back_is_written_in_python(serve_app):
    messages = [{"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "now", "arguments": '{"zone": "CET", "local": false}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    tokens = requests.post(f"{serve_app.url}/tokenize", json={"model": serve_app.model, "messages": messages,
                                                                    "tools": [NOW]}, timeout=60).json()["tokens"]
    prompt = requests.post(f"{serve_app.url}/detokenize", json={"model": serve_app.model, "tokens": tokens},
                           timeout=60).json()["prompt"]
    assert '<|assistant|>\n[now(zone="CET", local=False)]<|end|>' in prompt
