"""Tool calls, /tokenize and /detokenize through the served app and the real openai client.

Imported by tests/serve/test_openai_api.py so that they run against that module's app (one
app start for both). Arguments of every returned call are parsed and validated with
jsonschema: the calls are generated under their tools' parameter grammar."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import requests

from tests.guided.test_string_formats import CHECKER
from tests.serve.api_helpers import streamed_chat

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
SCHEDULE = {"type": "function", "function": {
    "name": "schedule", "description": "Book a room for a meeting",
    "parameters": {"type": "object", "properties": {
        "day": {"type": "string", "format": "date"},
        "attendees": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                             "role": {"enum": ["host", "guest"]}},
            "required": ["name", "role"]}},
        "room": {"type": "object", "properties": {"floor": {"type": "integer"},
                                                  "quiet": {"type": "boolean"}},
                 "required": ["floor", "quiet"]}},
        "required": ["day", "attendees", "room"]}}}
TOOLS = [WEATHER, SCHEDULE]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MAX_TOKENS = 1024  # four calls of `schedule`, sampled at temperature 1, fit


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def ask(client, serve_app, tool_choice, seed: int, **kwargs):
    return client.chat.completions.create(
        model=serve_app.model, messages=[{"role": "user", "content": "Plan my day."}],
        tools=TOOLS, tool_choice=tool_choice, temperature=1.0, seed=seed,
        max_tokens=MAX_TOKENS, **kwargs)


def check_call(call, name: str | None = None) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    if name is not None:
        assert call.function.name == name
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name], format_checker=CHECKER)
    return args


def called_function(choice) -> str | None:
    """The function every call is of under `choice` (None: any)."""
    if choice == "required":
        return None
    if choice["type"] == "allowed_tools":
        [only] = choice["allowed_tools"]["tools"]
        return only["function"]["name"]
    return choice["function"]["name"]


ALLOWED_SCHEDULE = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [named("schedule")]}}


def test_required_and_named_calls_validate(client, serve_app):
    jobs = [(choice, seed) for choice in ("required", named("get_weather"), named("schedule"), ALLOWED_SCHEDULE)
            for seed in range(4)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: (job, ask(client, serve_app, *job)), jobs))
    for (choice, seed), r in results:
        [c] = r.choices
        assert c.finish_reason == "tool_calls", (choice, seed, c)
        assert c.message.content is None and c.message.tool_calls
        if choice not in ("required", ALLOWED_SCHEDULE):
            assert len(c.message.tool_calls) == 1
        for call in c.message.tool_calls:
            check_call(call, called_function(choice))


def test_auto_is_text_or_a_valid_call(client, serve_app):
    for seed in range(4):
        [c] = ask(client, serve_app, "auto", seed).choices
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            for call in c.message.tool_calls:
                check_call(call)
        else:  # text, never empty (an empty answer once was all `auto` let through)
            assert c.message.content and not c.message.content.startswith("{")


def test_streamed_call_reassembles_to_the_same_call(client, serve_app):
    whole = ask(client, serve_app, named("schedule"), seed=7).choices[0]
    streamed = streamed_chat(ask(client, serve_app, named("schedule"), seed=7, stream=True))
    assert streamed.finish_reason == "tool_calls" and list(streamed.calls) == [0]
    # the arguments streamed as they were written (how many deltas depends on the machine: a
    # reader that falls behind gets the steps it missed merged)
    assert streamed.argument_deltas > 1
    [expected] = whole.message.tool_calls
    assert streamed.call_list == [(expected.function.name, expected.function.arguments)]
    assert streamed.calls[0]["id"].startswith("call_")


def test_a_call_cut_at_max_tokens_is_reported_as_far_as_it_was_written(client, serve_app):
    whole = ask(client, serve_app, named("schedule"), seed=3)
    full = whole.choices[0].message.tool_calls[0]
    kwargs = dict(model=serve_app.model, messages=[{"role": "user", "content": "Plan my day."}], tools=TOOLS,
                  tool_choice=named("schedule"), temperature=1.0, seed=3,
                  max_tokens=whole.usage.completion_tokens // 2)
    [cut] = client.chat.completions.create(**kwargs).choices
    assert cut.finish_reason == "length" and cut.message.content is None
    [call] = cut.message.tool_calls
    assert call.function.name == "schedule" and call.function.arguments
    assert full.function.arguments.startswith(call.function.arguments) and full.function.arguments != call.function.arguments
    streamed = streamed_chat(client.chat.completions.create(**kwargs, stream=True))
    assert (streamed.finish_reason, streamed.call_list) == ("length", [("schedule", call.function.arguments)])


def conversation() -> list[dict]:
    return [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temperature": 3}'},
    ]


def test_tool_result_round_trips_through_the_template(client, serve_app, tokenizer):
    r = client.chat.completions.create(model=serve_app.model, messages=conversation(),
                                       tools=TOOLS, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    body = {"model": serve_app.model, "messages": conversation(), "tools": TOOLS}
    tokens = requests.post(serve_app.url + "/tokenize", json=body, timeout=60).json()["tokens"]
    assert tokens[-len(tokenizer.encode("<|assistant|>\n", add_special_tokens=False)):] == \
        tokenizer.encode("<|assistant|>\n", add_special_tokens=False)
    prompt = tokenizer.decode(tokens)
    call = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    assert prompt.index('"schedule"') < prompt.index(call) < prompt.index('{"temperature": 3}')
    assert r.usage.prompt_tokens == len(tokens)


@pytest.mark.parametrize("kwargs, param, words", [
    ({"tools": TOOLS, "tool_choice": named("nope")}, "tool_choice", "nope"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "patternProperties": {"^a": {}}}}}], "tool_choice": "required"},
     "tools", "patternProperties"),
    ({"tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format", "tool calls"),
])
def test_bad_tool_requests_get_400(client, serve_app, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=serve_app.model, max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}], **kwargs)
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]
    ok = client.chat.completions.create(model=serve_app.model, max_tokens=2,
                                        messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_tokenize_and_detokenize(serve_app, tokenizer):
    url = serve_app.url
    models = requests.get(serve_app.base_url + "/models", timeout=30).json()["data"][0]
    text = "héllo wörld 日本"
    r = requests.post(url + "/tokenize", json={"model": serve_app.model, "prompt": text,
                                               "return_token_strs": True}, timeout=30).json()
    assert r["tokens"] == tokenizer.encode(text) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == models["max_model_len"] > 0
    assert r["token_strs"] == tokenizer.convert_ids_to_tokens(r["tokens"])
    back = requests.post(url + "/detokenize", json={"model": serve_app.model,
                                                    "tokens": r["tokens"]}, timeout=30).json()
    assert back == {"prompt": tokenizer.decode(r["tokens"])}
    messages = [{"role": "user", "content": text}]
    chat = requests.post(url + "/tokenize", json={"messages": messages}, timeout=30).json()
    expected = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tokenizer.encode(expected, add_special_tokens=False)
    assert chat["token_strs"] is None
    bad = requests.post(url + "/detokenize", json={"tokens": [0, len(tokenizer)]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    wrong = requests.post(url + "/tokenize", json={"model": "other", "prompt": "x"}, timeout=30)
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
