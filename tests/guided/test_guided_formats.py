"""Every spelling of an output format becomes the format dict the ConstraintService compiles."""

from __future__ import annotations

import pytest

from app.guided.compiler import regex_for_format
from deployments.chat_protocol import ChatCompletionRequest
from deployments.guided_formats import FormatRequestError, requested_format
from deployments.protocol import CompletionRequest

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
MESSAGES = [{"role": "user", "content": "x"}]
GRAMMAR = 'root ::= "yes" | "no"'


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


@pytest.mark.parametrize("fields,param,fmt", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     "response_format", {"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
    ({"response_format": {"type": "json_object"}}, "response_format", {"type": "json_object"}),
    ({"guided_json": SCHEMA}, "guided_json", {"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
    ({"guided_regex": "[0-9]+"}, "guided_regex", {"type": "regex", "pattern": "[0-9]+"}),
    ({"guided_choice": ["yes", "no"]}, "guided_choice", {"type": "choice", "choices": ["yes", "no"]}),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": " ?"}, "guided_json",
     {"type": "json_schema", "json_schema": {"schema": SCHEMA}, "whitespace_pattern": " ?"}),
    ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}}, "structured_outputs",
     {"type": "json_schema", "json_schema": {"schema": SCHEMA}, "whitespace_pattern": ""}),
    ({"structured_outputs": {"regex": "a|b"}}, "structured_outputs", {"type": "regex", "pattern": "a|b"}),
    ({"structured_outputs": {"choice": ["a"]}}, "structured_outputs", {"type": "choice", "choices": ["a"]}),
    ({"structured_outputs": {"json_object": True}}, "structured_outputs", {"type": "json_object"}),
    ({"structured_outputs": {"grammar": GRAMMAR}}, "structured_outputs", {"type": "grammar", "grammar": GRAMMAR}),
    ({"guided_grammar": GRAMMAR}, "guided_grammar", {"type": "grammar", "grammar": GRAMMAR}),
])
def test_spellings(fields, param, fmt):
    for req in (chat(**fields), CompletionRequest(prompt="x", **fields)):
        found = requested_format(req)
        assert (found.param, found.format) == (param, fmt)
        regex_for_format(found.format)  # compiles to a regex


def test_plain_text_and_nulls():
    assert requested_format(chat()) is None
    assert requested_format(chat(response_format={"type": "text"})) is None
    assert requested_format(chat(guided_json=None, guided_regex=None)) is None


@pytest.mark.parametrize("fields,param,message", [
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "one output format"),
    ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json",
     "one output format"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "only one"),
    ({"structured_outputs": {"grammar": GRAMMAR, "regex": "a"}}, "structured_outputs", "only one"),
    ({"guided_grammar": GRAMMAR, "guided_regex": "a"}, "guided_grammar", "one output format"),
])
def test_contradictions_name_the_field(fields, param, message):
    with pytest.raises(FormatRequestError, match=message) as info:
        requested_format(chat(**fields))
    assert info.value.param == param
