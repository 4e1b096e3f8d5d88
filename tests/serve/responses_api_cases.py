"""OpenAI's Responses API through the served app and the real `openai` client: the same answer
as the chat completion it describes, whole and streamed (through the client's own stream
accumulator), tool calls that validate, output formats, logprobs, and 400s for what it cannot do.

Imported by tests/serve/test_openai_api.py so that they run against that module's app."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel

from tests.serve.api_helpers import chat_ids, engine_text, max_model_len, streamed_response, wait_for_free_kv
from tests.serve.tool_call_cases import CHECKER, MAX_TOKENS, TOOLS

# The chat tools in the Responses API's flat shape.
RESPONSE_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
SCHEMAS = {t["name"]: t["parameters"] for t in RESPONSE_TOOLS}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something"}]


def test_a_response_is_the_chat_completion_it_describes(serve_app, client, engine, tokenizer):
    expected, n = engine_text(engine, tokenizer, chat_ids(tokenizer, MESSAGES), 20)
    r = client.responses.create(model=serve_app.model, instructions="Be brief.", input="Say something",
                                max_output_tokens=20, temperature=0, metadata={"run": "1"},
                                reasoning={"effort": "low"})  # a template variable this template ignores
    assert r.id.startswith("resp_") and r.object == "response" and r.store is True
    assert r.output_text == expected
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert (r.usage.input_tokens, r.usage.output_tokens) == (len(chat_ids(tokenizer, MESSAGES)), n)
    assert r.usage.total_tokens == r.usage.input_tokens + n
    if n == 20:  # cut at max_output_tokens
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed" and r.incomplete_details is None
    assert (r.temperature, r.max_output_tokens, r.metadata, r.reasoning.effort) == (0.0, 20, {"run": "1"}, "low")
    as_items = client.responses.create(model=serve_app.model, max_output_tokens=20, temperature=0, input=[
        {"role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say something"}]}])
    assert as_items.output_text == expected


def test_truncation_auto_leaves_out_the_fewest_oldest_turns(serve_app, client, engine, tokenizer):
    """A conversation longer than the context is refused, unless `truncation: "auto"`: then its
    oldest turns go until the prompt and `max_output_tokens` fit, and the answer is the one to
    what is left."""
    head, last = [{"role": "system", "content": "Be brief."}], [{"role": "user", "content": "Say something"}]
    turns = [[{"role": "user", "content": f"Question {t}: " + "tell me more " * 60},
              {"role": "assistant", "content": "word " * 120}] for t in range(12)]
    limit, most = max_model_len(serve_app), 16
    kwargs = dict(model=serve_app.model, instructions="Be brief.", input=[m for t in turns for m in t] + last,
                  max_output_tokens=most, temperature=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(**kwargs)

    def prompt(dropped: int) -> list[int]:
        return chat_ids(tokenizer, head + [m for t in turns[dropped:] for m in t] + last)

    dropped = next(d for d in range(len(turns)) if len(prompt(d)) + most <= limit)
    expected, _ = engine_text(engine, tokenizer, prompt(dropped), most)
    r = client.responses.create(**kwargs, truncation="auto")
    assert 0 < dropped < len(turns) - 1
    assert (r.truncation, r.usage.input_tokens, r.output_text) == ("auto", len(prompt(dropped)), expected)


def test_a_streamed_response_accumulates_to_the_whole_one(serve_app, client):
    kwargs = dict(model=serve_app.model, input="Write a list of fruits", max_output_tokens=40, temperature=0)
    whole = client.responses.create(**kwargs)
    kinds, deltas, final = streamed_response(client, "response.output_text.delta", **kwargs)
    assert "".join(deltas) == whole.output_text and len(deltas) > 1
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert (final.id != whole.id) and final.status == whole.status
    assert final.output[0].content[0].text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_required_and_named_function_calls_validate_and_stream_the_same(serve_app, client):
    for choice in ("required", {"type": "function", "name": "schedule"}):
        for seed in range(3):
            r = client.responses.create(model=serve_app.model, input="Plan my day.", tools=RESPONSE_TOOLS,
                                        tool_choice=choice, temperature=1.0, max_output_tokens=MAX_TOKENS,
                                        extra_body={"seed": seed})
            assert r.status == "completed" and r.output and all(i.type == "function_call" for i in r.output)
            for call in r.output:
                assert call.call_id.startswith("call_") and call.id != call.call_id
                jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name], format_checker=CHECKER)
    kwargs = dict(model=serve_app.model, input="Plan my day.", tools=RESPONSE_TOOLS, temperature=1.0,
                  tool_choice={"type": "function", "name": "schedule"}, max_output_tokens=MAX_TOKENS,
                  extra_body={"seed": 7})
    whole = client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    [call] = final.output
    assert (call.name, call.arguments) == ("schedule", whole.output[0].arguments) and "".join(deltas) == call.arguments
    assert len(deltas) > 1  # as they were written, not in one piece at the end (a reader that falls
    # behind gets the steps it missed merged, so the count depends on the machine)


def test_a_function_call_output_reaches_the_template_as_chat_tool_turns_do(serve_app, client):
    chat_messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_abc", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"temperature": 3}'}]
    tokens = requests.post(serve_app.url + "/tokenize", timeout=60, json={
        "messages": chat_messages, "tools": TOOLS}).json()["tokens"]
    r = client.responses.create(model=serve_app.model, tools=RESPONSE_TOOLS, max_output_tokens=4, temperature=0,
                                input=[{"role": "user", "content": "Weather in Oslo?"},
                                       {"type": "function_call", "call_id": "call_abc", "name": "get_weather",
                                        "arguments": '{"city": "Oslo", "unit": "celsius"}'},
                                       {"type": "function_call_output", "call_id": "call_abc",
                                        "output": '{"temperature": 3}'}])
    assert r.usage.input_tokens == len(tokens)
    chat = client.chat.completions.create(model=serve_app.model, messages=chat_messages, tools=TOOLS,
                                          max_tokens=4, temperature=0)
    assert r.output_text == (chat.choices[0].message.content or "")


class Fruit(BaseModel):
    name: str
    count: int


def test_a_json_schema_format_parses_into_the_clients_model(serve_app, client):
    for seed in range(3):
        r = client.responses.parse(model=serve_app.model, input="A fruit, as JSON", text_format=Fruit,
                                   temperature=1.0, max_output_tokens=200, extra_body={"seed": seed})
        assert isinstance(r.output_parsed, Fruit), r.output_text
    flag = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "additionalProperties": False}
    r = client.responses.create(model=serve_app.model, input="Some JSON", max_output_tokens=200, temperature=0,
                                text={"format": {"type": "json_schema", "name": "flag", "schema": flag}})
    assert set(json.loads(r.output_text)) == {"ok"} and r.text.format.name == "flag"


def test_logprobs_come_when_included_and_match_chats(serve_app, client):
    r = client.responses.create(model=serve_app.model, input="Say something", max_output_tokens=8, temperature=0,
                                top_logprobs=2, include=["message.output_text.logprobs"])
    logprobs = r.output[0].content[0].logprobs
    chat = client.chat.completions.create(model=serve_app.model, messages=[{"role": "user", "content": "Say something"}],
                                          max_tokens=8, temperature=0, logprobs=True, top_logprobs=2)
    assert [lp.token for lp in logprobs] == [lp.token for lp in chat.choices[0].logprobs.content]
    assert [lp.logprob for lp in logprobs] == pytest.approx([lp.logprob for lp in chat.choices[0].logprobs.content],
                                                            abs=1e-4)
    assert all(len(lp.top_logprobs) == 2 for lp in logprobs)
    plain = client.responses.create(model=serve_app.model, input="Say something", max_output_tokens=8, temperature=0)
    assert not plain.output[0].content[0].logprobs


def test_a_client_leaving_a_streamed_response_frees_its_kv_blocks(serve_app, client):
    stream = client.responses.create(model=serve_app.model, input="Count to a thousand", stream=True,
                                     max_output_tokens=1500, temperature=0, extra_body={"ignore_eos": True})
    it = iter(stream)
    while next(it).type != "response.output_text.delta":
        pass
    assert serve_app.target_handle().stats.remote().result()["num_requests_running"] == 1
    stream.close()
    wait_for_free_kv(serve_app)


@pytest.mark.parametrize("kwargs, param, words", [
    ({"conversation": "conv_abc"}, "conversation", "no stored conversations"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]}, "input",
     "input_image"),
    ({"tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"tools": RESPONSE_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({"max_output_tokens": 10 ** 6}, "max_output_tokens", "maximum context length"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "patternProperties": {"^a": {}}}}}}, "text.format", "patternProperties"),
])
def test_bad_response_requests_get_400_and_the_server_keeps_serving(serve_app, client, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**{"model": serve_app.model, "input": "hi", "max_output_tokens": 4, **kwargs})
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert words in error["message"]
    assert client.responses.create(model=serve_app.model, input="hi", max_output_tokens=2).status in (
        "completed", "incomplete")


def test_other_models_are_not_found(serve_app, client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other", input="hi")
