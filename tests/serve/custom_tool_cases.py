"""OpenAI's custom tools through the served app and the real `openai` client, on chat completions and
the Responses API: a forced call's input is in its Lark grammar (Lark itself the judge), whole and
streamed alike; a bad grammar is a 400 naming `tools`.

Imported by tests/serve/test_openai_api.py so that they run against that module's app."""

from __future__ import annotations

import json

import openai
import pytest
from lark import Lark

# Short enough for the tiny model to finish under any seed; spacing allowed around the list's commas.
SQL = '''
start: "SELECT " columns " FROM " NAME
columns: NAME ("," NAME)~0..2
NAME: /[a-z]{1,6}/
'''
QUERY = {"type": "custom", "custom": {"name": "query", "description": "Run one SQL query", "format": {
    "type": "grammar", "grammar": {"definition": SQL, "syntax": "lark"}}}}
NOTE = {"type": "custom", "custom": {"name": "note", "description": "Write a note"}}
FORCED = {"type": "custom", "custom": {"name": "query"}}
MAX_TOKENS = 256
PARSER = Lark(SQL, start="start", lexer="dynamic_complete")


def asked(client, serve_app, seed: int, **kwargs):
    return client.chat.completions.create(
        model=serve_app.model, messages=[{"role": "user", "content": "How many users?"}], tools=[QUERY, NOTE],
        temperature=1.0, seed=seed, max_tokens=MAX_TOKENS, **kwargs)


def test_a_forced_custom_call_is_in_its_grammar_whole_and_streamed(client, serve_app):
    for seed in range(4):
        [c] = asked(client, serve_app, seed, tool_choice=FORCED).choices
        assert c.finish_reason == "tool_calls" and c.message.content is None
        [call] = c.message.tool_calls
        assert call.type == "custom" and call.id.startswith("call_") and call.custom.name == "query"
        PARSER.parse(call.custom.input)  # raises if it is not in the grammar
    whole = asked(client, serve_app, 7, tool_choice=FORCED).choices[0].message.tool_calls[0]
    chunks = list(asked(client, serve_app, 7, tool_choice=FORCED, stream=True))
    deltas = [d for chunk in chunks for choice in chunk.choices for d in choice.delta.tool_calls or []]
    first = deltas[0].model_dump()
    assert first["id"].startswith("call_") and (first["type"], first["custom"]["name"]) == ("custom", "query")
    pieces = [d.model_dump()["custom"]["input"] or "" for d in deltas]
    assert "".join(pieces) == whole.custom.input
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_with_custom_tools_is_text_or_calls_each_in_its_format(client, serve_app):
    for seed in range(4):
        [c] = asked(client, serve_app, seed).choices
        for call in c.message.tool_calls or []:
            assert call.type == "custom" and call.custom.name in ("query", "note")
            if call.custom.name == "query":
                PARSER.parse(call.custom.input)
        if not c.message.tool_calls:
            assert c.message.content


def test_a_custom_call_fed_back_continues_the_conversation(client, serve_app):
    r = client.chat.completions.create(model=serve_app.model, max_tokens=4, temperature=0, tools=[QUERY], messages=[
        {"role": "user", "content": "How many users?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "custom", "custom": {
            "name": "query", "input": "SELECT n FROM users"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}])
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("tool, words", [
    ({"type": "custom", "custom": {"name": "q", "format": {"type": "grammar", "grammar": {
        "definition": "start: %declare", "syntax": "lark"}}}}, "lark grammar"),
    ({"type": "custom", "custom": {"name": "q", "format": {"type": "grammar", "grammar": {
        "definition": "(unclosed", "syntax": "regex"}}}}, "regex grammar"),
])
def test_a_custom_tool_whose_grammar_cannot_be_enforced_is_a_400(client, serve_app, tool, words):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=serve_app.model, max_tokens=4, tools=[tool],
                                       messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["param"] == "tools" and words in info.value.body["message"]


def test_the_responses_api_gives_a_custom_tool_call_item_whole_and_streamed(client, serve_app):
    tools = [{"type": "custom", **QUERY["custom"]}]
    kwargs = dict(model=serve_app.model, input="How many users?", tools=tools, temperature=1.0,
                  tool_choice={"type": "custom", "name": "query"}, max_output_tokens=MAX_TOKENS,
                  extra_body={"seed": 7})
    whole = client.responses.create(**kwargs)
    [item] = whole.output
    assert item.type == "custom_tool_call" and item.name == "query" and item.call_id.startswith("call_")
    PARSER.parse(item.input)
    with client.responses.stream(**kwargs) as stream:
        deltas = [e.delta for e in stream if e.type == "response.custom_tool_call_input.delta"]
        final = stream.get_final_response()
    [streamed] = final.output
    assert streamed.input == item.input == "".join(deltas)
    again = client.responses.create(model=serve_app.model, tools=tools, max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": "How many users?"},
        {"type": "custom_tool_call", "call_id": item.call_id, "name": "query", "input": item.input},
        {"type": "custom_tool_call_output", "call_id": item.call_id, "output": "42"}])
    assert again.status in ("completed", "incomplete")
    assert json.loads(whole.model_dump_json())["tools"][0]["type"] == "custom"
