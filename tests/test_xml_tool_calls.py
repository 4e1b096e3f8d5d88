"""Tool calls written as XML parameters (Qwen3-Coder's and Qwen3.5's convention): values typed by
their schema, text values bare, the grammar's limits, and templates that write them
(deployments/xml_tool_calls.py, deployments/xml_tool_call_reader.py). The walks and the stream
tests in tests/test_tool_calls.py and tests/test_tool_call_stream.py run this syntax too."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from deployments.chat_protocol import ChatCompletionRequest
from deployments.guided_formats import FormatRequestError
from deployments.tool_call_stream import ToolStream, parse_calls
from deployments.tool_calls import (DEEPSEEK_V32, GLM45, GLM47, QWEN3_CODER, SEED_OSS, STEP3, render_messages,
                                    requested_tool_format)
from tests.checkpoints import DEFAULT_TARGET
from tests.test_tool_calls import GLM45_TEMPLATE, GLM47_TEMPLATE, QWEN35_TEMPLATE, TOOL_DEFINITIONS, WEATHER, accepts, auto_index, conversation, vocab  # noqa: F401

OSLO = {"city": "Oslo", "unit": "celsius"}


def tools_request(parameters: dict, **kwargs) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tool_choice="required", tools=[
        {"type": "function", "function": {"name": "f", "parameters": parameters}}], **kwargs)


def test_a_string_is_its_bare_text_and_anything_else_json():
    text = QWEN3_CODER.render([("book_meeting", {"when": "2026-11-28T10:00:00Z", "room": {"floor": 3},
                                                 "people": [{"email": "a@b.no", "optional": False}]})])
    assert "<parameter=when>\n2026-11-28T10:00:00Z\n</parameter>" in text
    assert '<parameter=room>\n{"floor": 3}\n</parameter>' in text
    [call] = parse_calls(text, QWEN3_CODER, TOOL_DEFINITIONS)[1]
    assert json.loads(call.function.arguments) == {"when": "2026-11-28T10:00:00Z", "room": {"floor": 3},
                                                   "people": [{"email": "a@b.no", "optional": False}]}


@pytest.mark.parametrize("value", ['say "hi"\\n', "a </parameter> b", "ends in a newline\n", "\n", "",
                                   "<parameter=x>\n", "</function>\n</tool_call>"])
def test_a_text_value_is_read_to_the_first_value_end_and_escaped_as_json(value):
    text = QWEN3_CODER.render([("f", {"note": value, "n": 2})])
    [call] = parse_calls(text, QWEN3_CODER, tools_request({"type": "object", "properties": {
        "note": {"type": "string"}, "n": {"type": "integer"}}}).tools)[1]
    assert json.loads(call.function.arguments) == {"note": value, "n": 2}


OPTIONAL_NOTE = {"type": "object", "properties": {  # as Pydantic writes `note: str | None = None`
    "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}, "n": {"type": "integer"}}}


@pytest.mark.parametrize("note", [None, "Oslo", "nul", "null pointer", "", "x\nnull"])
def test_a_nullable_string_is_its_bare_text_or_null_and_streams_as_parsed(note):
    text = QWEN3_CODER.render([("f", {"note": note, "n": 2})])
    assert f"<parameter=note>\n{'null' if note is None else note}\n</parameter>" in text
    tools = tools_request(OPTIONAL_NOTE).tools
    whole = parse_calls(text, QWEN3_CODER, tools)[1][0].function.arguments
    assert json.loads(whole) == {"note": note, "n": 2}
    stream, sent = ToolStream(QWEN3_CODER, tools), []
    for c in text:
        sent += [p.arguments for p in stream.feed(c)[1]]
    assert "".join(sent) == whole


def test_a_nullable_string_is_generated_bare_or_as_null(vocab):
    from app.guided.compiler import compile_regex, regex_for_format
    note = {"type": ["string", "null"], "maxLength": 3}
    fmt = requested_tool_format(tools_request({"type": "object", "properties": {"note": note}}), QWEN3_CODER).format
    index = compile_regex(regex_for_format(fmt), vocab)
    for value, allowed in [(None, True), ("abc", True), ("abcd", False), ("a\nb", False)]:
        assert accepts(index, vocab, QWEN3_CODER.render([("f", {"note": value})])) is allowed, value


def test_a_value_is_text_where_its_tool_does_not_type_it():
    """A parameter the schema does not list, and a tool the request does not define (vLLM's way)."""
    text = QWEN3_CODER.render([("f", {"n": "2", "extra": "3"}), ("unknown", {"x": "[1]"})])
    calls = parse_calls(text, QWEN3_CODER, tools_request({"type": "object", "properties": {
        "n": {"type": "integer"}}}).tools)[1]
    assert [json.loads(c.function.arguments) for c in calls] == [{"n": 2, "extra": "3"}, {"x": "[1]"}]


def test_the_arguments_stream_as_json_and_hold_back_what_may_end_a_value():
    text = QWEN3_CODER.render([("get_weather", OSLO)])
    stream, sent = ToolStream(QWEN3_CODER, TOOL_DEFINITIONS), []
    for c in text:
        sent += [p.arguments for p in stream.feed(c)[1]]
    assert "".join(sent) == json.dumps(OSLO) and sent.count("") == 1  # the opening piece
    stream = ToolStream(QWEN3_CODER, TOOL_DEFINITIONS)
    at = text.index("Oslo") + 4
    _, pieces = stream.feed(text[:at + 3])  # "Oslo\n</" may still be the value's end
    assert "".join(p.arguments for p in pieces) == '{"city": "Oslo'
    _, pieces = stream.feed("x")
    assert "".join(p.arguments for p in pieces) == '\\n</x'


def test_an_output_cut_inside_a_value_keeps_what_was_written():
    text = QWEN3_CODER.render([("get_weather", OSLO), ("now", {})])
    [call] = parse_calls(text[:text.index("Oslo") + 2], QWEN3_CODER, TOOL_DEFINITIONS)[1]
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Os')
    before_name = text[:text.index("get_weather") + 5]
    assert parse_calls(before_name, QWEN3_CODER, TOOL_DEFINITIONS) == (before_name, None)


def test_the_grammar_keeps_schema_order_requires_the_required_and_bounds_lengths(vocab):
    index = auto_index(QWEN3_CODER, vocab)
    call = QWEN3_CODER.render([("get_weather", OSLO)])
    assert accepts(index, vocab, call) and accepts(index, vocab, "Sunny.\n\n" + call)
    for wrong in [{"unit": "celsius", "city": "Oslo"}, {"city": "Oslo"}, {"city": "Oslo", "unit": "kelvin"},
                  {"city": "Oslo\nNorway", "unit": "celsius"}, {"city": "x" * 13, "unit": "celsius"}]:
        assert not accepts(index, vocab, QWEN3_CODER.render([("get_weather", wrong)])), wrong


@pytest.mark.parametrize("parameters, message", [
    ({"type": "object", "properties": {"a>b": {"type": "string"}}}, "rename it"),
    ({"anyOf": [{"type": "object"}, {"type": "object"}]}, "one object schema"),
    ({"type": "object", "properties": {"when": {"type": "string", "format": "date", "maxLength": 4}}}, "minLength"),
    ({"type": "object", "properties": {"when": {"type": "string", "format": "moon-phase"}}}, "moon-phase"),
])
def test_schemas_that_cannot_be_written_as_xml_parameters_are_a_400_on_tools(parameters, message):
    with pytest.raises(FormatRequestError, match=message) as info:
        requested_tool_format(tools_request(parameters), QWEN3_CODER)
    assert info.value.param == "tools"


def test_a_function_without_listed_parameters_takes_any_as_text(vocab):
    from app.guided.compiler import compile_regex, regex_for_format
    fmt = requested_tool_format(tools_request({"type": "object"}), QWEN3_CODER).format
    index = compile_regex(regex_for_format(fmt), vocab)
    assert accepts(index, vocab, QWEN3_CODER.render([("f", {"path": "a.txt", "body": "x\ny"})]))
    assert accepts(index, vocab, QWEN3_CODER.render([("f", {})]))


@pytest.mark.parametrize("syntax, template", [(QWEN3_CODER, QWEN35_TEMPLATE), (GLM45, GLM45_TEMPLATE),
                                              (GLM47, GLM47_TEMPLATE)], ids=["qwen3.5", "glm4.5", "glm4.7"])
def test_a_template_writes_fed_back_calls_as_the_grammar_does(syntax, template):
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    req = conversation()
    messages = render_messages(req.messages, req.tools, syntax, native=True)
    text = tok.apply_chat_template(messages, tools=[WEATHER], chat_template=template, tokenize=False)
    call = syntax.render([("get_weather", OSLO)])
    assert call in text, text
    assert parse_calls(call, syntax, req.tools)[1][0].function.arguments == json.dumps(OSLO)


@pytest.mark.parametrize("syntax", [GLM45, GLM47], ids=lambda s: s.name)
def test_glm_writes_each_call_as_a_tool_call_element(syntax):
    text = syntax.render([("get_weather", OSLO), ("now", {})])
    newline = "\n" if syntax is GLM45 else ""
    assert text == (f"<tool_call>get_weather{newline}<arg_key>city</arg_key>{newline}<arg_value>Oslo</arg_value>"
                    f"{newline}<arg_key>unit</arg_key>{newline}<arg_value>celsius</arg_value>{newline}</tool_call>"
                    f"{newline}<tool_call>now{newline}</tool_call>")
    calls = parse_calls("Let me see." + text, syntax, TOOL_DEFINITIONS)
    assert calls[0] == "Let me see." and [c.function.name for c in calls[1]] == ["get_weather", "now"]


# What Seed-OSS-36B-Instruct wrote (vLLM's tests of its seed_oss parser), Step 3's calls as SGLang's
# step3 detector lays them out, and DeepSeek V3.2's as its template (llama.cpp's, checked by hand) writes them.
WRITTEN_BY_THE_MODEL = {
    "deepseek_v32": ('<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                     '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n'
                     '<｜DSML｜parameter name="unit" string="true">celsius</｜DSML｜parameter>\n'
                     "</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
    "seed_oss": ("<seed:tool_call>\n<function=get_weather>\n<parameter=city>Oslo</parameter>\n"
                 "<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call>"),
    "step3": ('<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">\n'
              '<steptml:parameter name="city">Oslo</steptml:parameter>\n'
              '<steptml:parameter name="unit">celsius</steptml:parameter>\n'
              "</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>"),
}


@pytest.mark.parametrize("syntax", [SEED_OSS, STEP3, DEEPSEEK_V32], ids=lambda s: s.name)
def test_calls_are_written_and_read_as_the_model_writes_them(syntax, vocab):
    written = WRITTEN_BY_THE_MODEL[syntax.name]
    assert syntax.render([("get_weather", OSLO)]) == written
    content, [call] = parse_calls("Checking. " + written, syntax, TOOL_DEFINITIONS)
    assert (content, call.function.name, json.loads(call.function.arguments)) == ("Checking. ", "get_weather", OSLO)
    assert accepts(auto_index(syntax, vocab), vocab, written)


def test_deepseek_v32_says_of_each_value_whether_it_is_text_or_json(vocab):
    """As vLLM's deepseek_v32 parser reads them, the attribute decides; the grammar writes what the schema says."""
    text = DEEPSEEK_V32.render([("f", {"note": "3", "n": 2, "tags": ["a"], "none": None})])
    assert '<｜DSML｜parameter name="note" string="true">3</｜DSML｜parameter>' in text
    assert '<｜DSML｜parameter name="n" string="false">2</｜DSML｜parameter>' in text
    schema = {"type": "object", "properties": {"note": {"type": "string"}, "n": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"type": "string"}},
                                               "none": {"type": ["string", "null"]}}}
    [call] = parse_calls(text, DEEPSEEK_V32, tools_request(schema).tools)[1]
    assert json.loads(call.function.arguments) == {"note": "3", "n": 2, "tags": ["a"], "none": None}
    untyped = parse_calls(text.replace('"n" string="false">2', '"n" string="true">2'), DEEPSEEK_V32)[1][0]
    assert json.loads(untyped.function.arguments)["n"] == "2"  # the model said text
    from app.guided.compiler import compile_regex, regex_for_format
    fmt = requested_tool_format(tools_request({**schema, "required": ["note", "n"]}), DEEPSEEK_V32).format
    index = compile_regex(regex_for_format(fmt), vocab)
    assert accepts(index, vocab, DEEPSEEK_V32.render([("f", {"note": "3", "n": 2})]))
    assert not accepts(index, vocab, DEEPSEEK_V32.render([("f", {"note": "3", "n": "2"})]))  # n as text
    assert accepts(index, vocab, DEEPSEEK_V32.render([("f", {"note": "3", "n": 2, "none": None})]))
    assert accepts(index, vocab, DEEPSEEK_V32.render([("f", {"note": "3", "n": 2, "none": "x"})]))


def test_a_template_without_tools_is_shown_the_xml_convention():
    req = conversation()
    messages = render_messages(req.messages, req.tools, QWEN3_CODER, native=False)
    assert "<function=function_name>\n<parameter=argument>\nvalue\n</parameter>\n</function>" in messages[0]["content"]
    assert QWEN3_CODER.render([("get_weather", OSLO)]) in messages[2]["content"]
