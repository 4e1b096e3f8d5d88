"""Pythonic tool calls (deployments/pythonic_tool_calls.py): what the grammar lets a model write is
Python that Python itself reads to the arguments the stream reports, booleans and None included;
the generic tests of every syntax (tests/test_tool_calls.py, tests/test_tool_call_stream.py) cover
the rest."""

from __future__ import annotations

import ast
import json
import random

import jsonschema
import pytest

from app.guided.compiler import compile_regex
from app.guided.errors import GuidedFormatError
from app.guided.vocabulary import load_guided_vocabulary
from deployments.pythonic_tool_calls import pythonic_call_regex, python_literal, render_call
from deployments.tool_call_stream import parse_calls
from deployments.tool_calls import PYTHONIC
from deployments.tool_protocol import ToolDefinition
from tests.checkpoints import DEFAULT_TARGET
from tests.guided.test_string_formats import accepts, distances_to_final, walk

FLAGS = {"type": "object", "properties": {
    "on": {"type": "boolean"}, "level": {"type": ["integer", "null"]}, "mode": {"enum": [True, None, "auto"]},
    "note": {"type": "string", "maxLength": 6}, "extra": {"description": "anything"},
    "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}, "options": {"type": "object"},
    "strict": {"type": "boolean", "const": True}},
    "required": ["on", "mode"]}
FREE = {"type": "object"}  # no parameters listed: any keywords, any values


def tool(name: str, parameters: dict) -> ToolDefinition:
    return ToolDefinition(function={"name": name, "parameters": parameters})


def python_arguments(text: str) -> list[tuple[str, dict]]:
    """The calls of a pythonic output as Python reads them."""
    calls = ast.parse(text, mode="eval").body
    assert isinstance(calls, ast.List)
    return [(c.func.id, {k.arg: ast.literal_eval(k.value) for k in c.keywords}) for c in calls.elts]


@pytest.fixture(scope="module")
def vocab():
    return load_guided_vocabulary(DEFAULT_TARGET)


@pytest.mark.parametrize("parameters", [FLAGS, FREE], ids=["listed", "free"])
def test_sampled_calls_are_python_that_reads_as_the_reported_arguments(vocab, parameters):
    index = compile_regex(r"\[" + pythonic_call_regex([tool("set", parameters)]) + r"\]", vocab)
    dist, seen = distances_to_final(index), set()
    for seed in range(30):
        text = walk(index, vocab, dist, random.Random(seed), stop_p=0.3).decode()
        [(name, arguments)] = python_arguments(text)
        [call] = parse_calls(text, PYTHONIC)[1]
        assert (call.function.name, json.loads(call.function.arguments)) == (name, arguments), text
        jsonschema.validate(arguments, parameters)
        seen |= {type(v) for v in arguments.values()}
    assert {bool, type(None)} <= seen or parameters is FREE


def test_values_are_written_back_as_python_literals():
    arguments = {"on": True, "level": None, "note": 'a "b"\n', "tags": [False], "extra": {"k": [1.5, None]}}
    text = "[" + render_call("set", arguments) + "]"
    assert text == '[set(on=True, level=None, note="a \\"b\\"\\n", tags=[False], extra={"k": [1.5, None]})]'
    assert python_arguments(text) == [("set", arguments)]
    assert python_literal("Ø") == '"Ø"'


def test_keywords_come_in_schema_order_with_the_required_ones_always(vocab):
    index = compile_regex(pythonic_call_regex([tool("set", FLAGS)]), vocab)
    for text in ["set(on=True, mode=None)", 'set(on=False, level=3, mode="auto", tags=[True, False])',
                 'set(on=True, mode=True, note="hi", extra={"a": 1})', 'set(on=True, mode=None, options={"a": False})',
                 "set(on=True, mode=None, strict=True)"]:
        assert accepts(index, vocab, text), text
    for text in ["set(mode=None, on=True)", "set(on=True)", "set(on=true, mode=None)", 'set(on="True", mode=None)',
                 'set(on=True, mode=None, note="\\/")', "set(on=True, mode=None, tags=[True, True, False])",
                 "set(on=True,mode=None)", "set(on=True, mode=None, )", 'set(on=True, mode=None, options={"a": false})',
                 'set(on=True, mode=None, extra=null)', "set(on=True, mode=None, strict=False)"]:
        assert not accepts(index, vocab, text), text


def test_a_parameter_that_is_not_a_python_identifier_is_refused():
    with pytest.raises(GuidedFormatError, match="'user-id' is not a Python identifier"):
        pythonic_call_regex([tool("get", {"type": "object", "properties": {"user-id": {"type": "string"}}})])
