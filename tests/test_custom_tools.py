"""OpenAI's custom tools on the chat route: offered to the model as a function of one `input`, whose
pattern is the grammar's; the call given back with its input, whole and streamed; bad ones refused."""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from app.guided.lark_grammar import lark_regex
from deployments.chat_protocol import ChatCompletionRequest
from deployments.choices import Choice
from deployments.custom_tools import InputStream, input_of
from deployments.detokenizer import IncrementalDetokenizer
from deployments.tool_calls import PLAIN
from deployments.tool_protocol import NamedToolChoice, ToolCall
from tests.test_chat_tool_stream import Routes, chunks, steps
from tests.test_choices import output
from tests.test_detokenizer import ByteTokenizer

SQL = 'start: "SELECT " NAME " FROM " NAME\nNAME: /[a-z]+/\n'
QUERY = {"type": "custom", "custom": {"name": "query", "description": "Run one SQL query",
                                      "format": {"type": "grammar", "grammar": {"definition": SQL, "syntax": "lark"}}}}
NOTE = {"type": "custom", "custom": {"name": "note"}}  # format: text, the default
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
HI = [{"role": "user", "content": "hi"}]

# texts a streamed input must come back as whatever the pieces' boundaries: quotes, backslashes,
# a \u escape cut anywhere, characters beyond the BMP (a surrogate pair written as two escapes)
TEXTS = ['SELECT a FROM b', 'a"b\\c\nd\x01é😀', '\\u0041\\', '😀😀x', '']


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=HI, **fields)


def test_a_custom_tool_is_offered_as_a_function_of_one_input_in_its_grammar():
    body = chat(tools=[QUERY, NOTE, NOW])
    query, note, now = body.tools
    assert (query.function.name, query.function.description) == ("query", "Run one SQL query")
    schema = query.function.parameters
    assert schema["required"] == ["input"] and schema["additionalProperties"] is False
    assert schema["properties"]["input"]["pattern"] == lark_regex(SQL)
    assert SQL in schema["properties"]["input"]["description"]  # the model is shown the grammar
    assert "pattern" not in note.function.parameters["properties"]["input"]
    assert now.function.name == "now" and now.function.parameters == {"type": "object"}
    assert [body.calls_custom_tool(n) for n in ("query", "note", "now")] == [True, True, False]


def test_a_regex_custom_tool_keeps_its_regex():
    tool = {"type": "custom", "custom": {"name": "code", "format": {
        "type": "grammar", "grammar": {"definition": r"[0-9]{3}-[A-Z]", "syntax": "regex"}}}}
    [function] = chat(tools=[tool]).tools
    assert function.function.parameters["properties"]["input"]["pattern"] == r"[0-9]{3}-[A-Z]"


def test_tool_choice_names_a_custom_tool_by_its_own_kind():
    body = chat(tools=[QUERY, NOW], tool_choice={"type": "custom", "custom": {"name": "query"}})
    assert body.tool_choice == NamedToolChoice(function={"name": "query"})
    allowed = chat(tools=[QUERY, NOW], tool_choice={"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "custom", "custom": {"name": "query"}}, {
            "type": "function", "function": {"name": "now"}}]}})
    assert [t.function.name for t in allowed.tool_choice.allowed_tools.tools] == ["query", "now"]


@pytest.mark.parametrize("fields, words", [
    ({"tools": [QUERY, NOW], "tool_choice": {"type": "custom", "custom": {"name": "now"}}},
     "not a custom tool"),
    ({"tools": [QUERY, NOW], "tool_choice": {"type": "function", "function": {"name": "query"}}},
     "it is a custom tool"),
    ({"tools": [{"type": "custom", "custom": {"name": "q", "format": {"type": "grammar", "grammar": {
        "definition": "start: start", "syntax": "lark"}}}}]}, "custom tool 'q': its lark grammar"),
    ({"tools": [{"type": "custom", "custom": {"name": "q", "format": {"type": "grammar", "grammar": {
        "definition": "(", "syntax": "regex"}}}}]}, "custom tool 'q': its regex grammar"),
    ({"tools": [{"type": "custom", "custom": {"name": "bad name"}}]}, "pattern"),
    ({"tools": [{"type": "custom", "custom": {"name": "q", "format": {"type": "grammar", "grammar": {
        "definition": "x", "syntax": "ebnf"}}}}]}, "syntax"),
])
def test_bad_custom_tools_are_refused(fields, words):
    with pytest.raises(ValidationError) as info:
        chat(**fields)
    assert words in str(info.value)


def test_a_custom_call_fed_back_is_its_functions_call():
    body = ChatCompletionRequest(tools=[QUERY], messages=[
        *HI, {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "custom", "custom": {
            "name": "query", "input": 'SELECT "a"\nFROM b'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "[]"}])
    [call] = body.messages[1].tool_calls
    assert isinstance(call, ToolCall) and call.id == "call_1" and call.function.name == "query"
    assert json.loads(call.function.arguments) == {"input": 'SELECT "a"\nFROM b'}


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("ascii_only", [True, False])
def test_an_input_streams_back_whole_however_its_arguments_are_cut(text, ascii_only):
    arguments = json.dumps({"input": text}, ensure_ascii=ascii_only)
    for size in (1, 2, 5):
        stream, streamed = InputStream(), ""
        for at in range(0, len(arguments), size):
            streamed += stream.feed(arguments[at:at + size])
            assert text.startswith(streamed)
        assert streamed == text == input_of(arguments)


def test_a_stream_keeps_only_the_arguments_it_has_not_decoded():
    """Each piece is decoded once, so a long input (a patch) costs its length, not its length squared."""
    arguments = json.dumps({"input": "line\\n \u00e9 \"q\" \U0001f600\n" * 200})
    stream = InputStream()
    for at in range(0, len(arguments), 3):
        stream.feed(arguments[at:at + 3])
        assert len(stream.undecoded) <= 12  # an escape cut short (`\\ud83d\\ude0` at most) and a piece


def test_a_stream_ends_at_the_inputs_closing_quote_or_an_escape_json_does_not_have():
    closed, bad = InputStream(), InputStream()
    assert closed.feed('{"input": "ab') == "ab" and closed.feed('c", "x": "d') == "c" and closed.feed('e"}') == ""
    assert bad.feed('{"input": "ab\\q') == "" and bad.feed("cd") == ""
    assert input_of('{"input": "ab\\qcd') == ""


def test_a_cut_calls_input_is_what_its_arguments_hold():
    assert input_of('{"input": "SELECT a FR') == "SELECT a FR"
    assert input_of('{"input": "a\\') == "a" and input_of('{"inp') == ""


def routed(body: ChatCompletionRequest, text: str, stream: bool):
    """The chat route's reply (whole, or its chunks) to a model that wrote `text`, a few bytes a step."""
    tok = ByteTokenizer()
    ids = tok.encode(text) + [tok.EOS]
    outputs = [output(ids[at:at + 3], min(at + 3, len(ids)), finished=at + 3 >= len(ids))
               for at in range(0, len(ids), 3)]
    choice = Choice(0, 0, [], stream=steps(outputs), detok=IncrementalDetokenizer(tok),
                    timer=SimpleNamespace(on_tokens=lambda n: None, on_finish=lambda *args: None))
    if stream:
        return asyncio.run(chunks(Routes(), body, choice))
    return asyncio.run(Routes()._whole_chat("chatcmpl-1", 0, body, [choice], True, False))


def test_the_reply_gives_a_custom_call_with_its_input_whole_and_streamed():
    query = 'SELECT "x"\\nFROM y'
    text = PLAIN.render([("query", {"input": query}), ("now", {})])
    body = chat(tools=[QUERY, NOW], stream=True)
    whole = routed(body, text, stream=False)
    message = whole.model_dump()["choices"][0]["message"]
    custom, function = message["tool_calls"]
    assert custom["type"] == "custom" and custom["custom"] == {"name": "query", "input": query}
    assert "function" not in custom and custom["id"].startswith("call_")
    assert function["type"] == "function" and function["function"] == {"name": "now", "arguments": "{}"}

    sent = routed(body, text, stream=True)
    deltas = [d for c in sent for d in c["choices"][0]["delta"].get("tool_calls") or []]
    first = next(d for d in deltas if d["index"] == 0)
    assert first["type"] == "custom" and first["id"] and first["custom"]["name"] == "query"
    pieces = [d["custom"]["input"] for d in deltas if d["index"] == 0]
    assert "".join(pieces) == query and len([p for p in pieces if p]) > 1  # it grows as it is written
    assert all("function" not in d for d in deltas if d["index"] == 0)
    assert sent[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_custom_tools_grammar_bounds_its_calls_input():
    """The tool-call grammar of a request with a custom tool (built as any function's) lets the input
    be only the grammar's texts, written as a JSON string."""
    from deployments.tool_calls import tool_format

    body = chat(tools=[QUERY], tool_choice={"type": "custom", "custom": {"name": "query"}})
    pattern = tool_format(body.tools, body.tool_choice, True, PLAIN)["pattern"]

    def call(query: str) -> str:
        return PLAIN.render([("query", {"input": query})])

    assert re.fullmatch(pattern, call("SELECT abc FROM d"))
    assert not re.fullmatch(pattern, call("SELECT abc FROM D"))
    assert not re.fullmatch(pattern, call("DROP TABLE d"))
