"""Gemma 4's tool calls (deployments/gemma4_tool_calls.py): what the grammar lets a model write reads,
by a reader written apart from the app's, as the arguments the stream reports, which the schema
accepts; keys come sorted, as the template writes them; the generic tests of every syntax
(tests/test_tool_calls.py, tests/test_tool_call_stream.py) cover the rest."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from app.guided.compiler import compile_regex
from app.guided.errors import GuidedFormatError
from app.guided.vocabulary import load_guided_vocabulary
from deployments.gemma4_tool_calls import QUOTE, gemma4_call_regex, gemma4_literal, render_call
from deployments.tool_call_stream import parse_calls
from deployments.tool_calls import GEMMA4, syntax_for_template
from deployments.tool_protocol import ToolDefinition
from tests.checkpoints import DEFAULT_TARGET
from tests.guided.test_string_formats import accepts, distances_to_final, walk

SETTINGS = {"type": "object", "properties": {
    "zone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}, "on": {"type": "boolean"},
    "Level": {"type": ["integer", "null"]}, "mode": {"enum": [True, None, "auto", 2.5]},
    "note": {"type": "string", "maxLength": 6}, "extra": {"description": "anything"},
    "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    "room": {"$ref": "#/$defs/room"}, "day": {"type": "string", "format": "date"}},
    "required": ["on", "mode"], "$defs": {"room": {"type": "object", "properties": {
        "floor": {"type": "integer"}, "name": {"type": "string"}}, "required": ["name"]}}}
FREE = {"type": "object"}  # no parameters listed: any keys, any values


def tool(name: str, parameters: dict) -> ToolDefinition:
    return ToolDefinition(function={"name": name, "parameters": parameters})


def read_apart(text: str) -> tuple[str, dict]:
    """A call `NAME{...}` read by splitting at the quote marks: the strings between them made JSON
    strings, bare keys elsewhere quoted."""
    name, arguments = re.fullmatch(r"([\w.\-]+)(\{.*\})", text, re.S).groups()
    pieces = arguments.split(QUOTE)
    assert len(pieces) % 2 == 1, text
    written = "".join(json.dumps(p) if i % 2 else re.sub(r"([{,])([A-Za-z_][\w.\-]*):", r'\1"\2":', p)
                      for i, p in enumerate(pieces))
    return name, json.loads(written)


@pytest.fixture(scope="module")
def vocab():
    return load_guided_vocabulary(DEFAULT_TARGET)


@pytest.mark.parametrize("parameters", [SETTINGS, FREE], ids=["listed", "free"])
def test_sampled_calls_read_apart_as_the_reported_arguments(vocab, parameters):
    index = compile_regex(gemma4_call_regex([tool("set", parameters)]), vocab)
    dist, seen = distances_to_final(index), set()
    for seed in range(30):
        text = walk(index, vocab, dist, random.Random(seed), stop_p=0.3).decode()
        name, arguments = read_apart(text)
        [call] = parse_calls(GEMMA4.prefix + text + GEMMA4.suffix, GEMMA4)[1]
        assert (call.function.name, json.loads(call.function.arguments)) == (name, arguments), text
        jsonschema.validate(arguments, parameters)
        assert parameters is FREE or list(arguments) == sorted(arguments, key=str.lower), text
        seen |= {type(v) for v in arguments.values()}
    assert {bool, type(None), str} <= seen or parameters is FREE


def test_keys_come_sorted_with_the_required_ones_always(vocab):
    index = compile_regex(gemma4_call_regex([tool("set", SETTINGS)]), vocab)
    q = QUOTE
    for text in ["set{mode:null,on:true}", f"set{{day:{q}2026-12-07{q},Level:3,mode:{q}auto{q},on:false}}",
                 f"set{{extra:[1,{q}x{q}],mode:2.5,note:{q}hi b{q},on:true,tags:[true,false]}}",
                 f"set{{mode:true,on:true,room:{{floor:2,name:{q}Aula{q}}},zone:{q}Europe/Oslo{q}}}"]:
        assert accepts(index, vocab, text), text
    for text in ["set{on:true,mode:null}", "set{on:true}", 'set{mode:null,on:"true"}', "set{mode:null,on:True}",
                 "set{mode:null, on:true}", f"set{{mode:{q}manual{q},on:true}}", "set{mode:null,on:true,}",
                 f"set{{mode:null,note:{q}toolong{q},on:true}}", f"set{{mode:null,note:{q}a<b{q},on:true}}",
                 "set{mode:null,on:true,tags:[true,true,true]}", "set{mode:null,on:true,room:{floor:2}}",
                 f"set{{mode:null,on:true,zone:{q}oslo{q}}}", f"set{{day:{q}2026-13-01{q},mode:null,on:true}}",
                 'set{extra:"x",mode:null,on:true}',
                 "set{extra:{a:[1]},mode:null,on:true}"]:  # an untyped value's lists and objects hold scalars
        assert not accepts(index, vocab, text), text


def test_a_function_that_lists_no_parameters_takes_any_keys_with_values_two_levels_deep(vocab):
    index = compile_regex(gemma4_call_regex([tool("f", FREE)]), vocab)
    for text in ["f{}", f"f{{b:[1,{QUOTE}x{QUOTE}],a:{{c:true}}}}", "f{a:null}"]:
        assert accepts(index, vocab, text), text
    for text in ["f{a:[[1]]}", "f{a:{b:{c:1}}}", "f{a b:1}"]:
        assert not accepts(index, vocab, text), text


def test_values_are_written_back_as_the_template_writes_them():
    """As its `format_argument` macro writes them: strings between quote marks as they are, keys bare
    and sorted (case aside), no spacing."""
    arguments = {"zone": 'a "b"\n', "on": True, "Level": None, "tags": [False, 1.5], "b": {"y": 1, "X": "z"}}
    q = QUOTE
    assert render_call("set", arguments) == (f"set{{b:{{X:{q}z{q},y:1}},Level:null,on:true,tags:[false,1.5],"
                                             f"zone:{q}a \"b\"\n{q}}}")
    assert read_apart(render_call("set", arguments)) == ("set", arguments)
    assert gemma4_literal("Ø") == q + "Ø" + q and render_call("now", {}) == "now{}"


@pytest.mark.parametrize("parameters, message", [
    ({"type": "object", "properties": {"a b": {"type": "string"}}}, "bare key"),
    ({"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
      "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}}, "recursive"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "does not point"),
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"maxLength": 2}]}}}, "allOf"),
])
def test_a_schema_it_cannot_write_is_refused_with_the_reason(parameters, message):
    with pytest.raises(GuidedFormatError, match=message):
        gemma4_call_regex([tool("f", parameters)])


def test_its_template_is_known_by_its_call_marker():
    assert syntax_for_template("{{- '<|tool_call>call:' + function['name'] + '{' -}}") is GEMMA4


def test_its_markers_and_quote_mark_are_markup_tokens_its_grammar_may_write(tmp_path):
    """Gemma 4's tokenizer holds `<|tool_call>`, `<tool_call|>` and the quote mark as special tokens."""
    from transformers import AutoTokenizer

    from app.guided.vocabulary import build_guided_vocabulary
    from deployments.markup_tokens import markup_tokens
    from tests.checkpoints import write_tokenizer_with_special_tokens

    specials = ["<|tool_call>", "<tool_call|>", QUOTE, "<|tool_response>"]
    tokenizer = AutoTokenizer.from_pretrained(write_tokenizer_with_special_tokens(tmp_path, DEFAULT_TARGET, specials))
    markup = markup_tokens(tokenizer, GEMMA4.markers)
    assert markup == tuple(sorted(specials[:3]))  # not the tool response's
    vocab = build_guided_vocabulary(tokenizer, markup_tokens=markup)
    assert vocab.token_bytes[tokenizer.convert_tokens_to_ids(QUOTE)] == QUOTE.encode()
