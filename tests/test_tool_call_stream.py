"""Tool calls streamed as they are written: a call's name goes out as soon as its string closes,
its arguments as they grow, and what a client assembles from the pieces, however the output was
cut into steps, is the whole output's parse (deployments/tool_call_stream.py)."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from app.guided.compiler import compile_regex, regex_for_format
from app.guided.vocabulary import load_guided_vocabulary
from deployments.call_notations import Gemma4Notation, JsonNotation, NamedNotation, PythonicNotation, XmlNotation
from deployments.tool_call_stream import ToolStream, parse_calls
from deployments.written_call import CallPiece
from deployments.tool_calls import (DEEPSEEK_V31, HERMES, KIMI_K2, MISTRAL_ARGS, MISTRAL_CALL_ID, PLAIN,
                                    requested_tool_format)
from tests.checkpoints import DEFAULT_TARGET
from tests.guided.test_string_formats import distances_to_final, walk
from tests.test_tool_calls import SYNTAXES, TAGGED, TOOL_DEFINITIONS, TOOLS, request

WEATHER = {"city": "Oslo, \"NO\" {x}", "unit": "celsius"}
MEETING = {"when": "2026-11-28T10:00:00Z", "people": [{"email": "a@b.no", "optional": False}],
           "room": {"floor": 3}}
# A pythonic call whose values hold the syntax's own characters and spacing of their own: (the
# call, its JSON arguments).
PYTHONIC_SPACED = ('now(a=[1, "), b=\\")]\\n</function_calls>"], b={"k" : None, "e": [True, 1E5]})',
                   '{"a": [1, "), b=\\")]\\n</function_calls>"], "b": {"k" : null, "e": [true, 1E5]}}')

# The same in Gemma 4's notation: raw strings that hold its brackets, a `<`, a quote and its markers.
GEMMA4_SPACED = ('now{a:[1,<|"|>}]<tool_call|>"\n<<|"|>],b:{k:null,e:[true,1E5]}}',
                 '{"a": [1, "}]<tool_call|>\\"\\n<"], "b": {"k": null, "e": [true, 1E5]}}')


def xml_strings(syntax) -> str:
    """A text value holding an XML syntax's own strings, all but its value's end."""
    xml = syntax.notation.parameters
    return xml.value_end[1:] + xml.parameter_open + "b" + xml.parameter_name_end + xml.function_end + syntax.tag


def rendered(syntax) -> list[str]:
    """Outputs with one call, two calls, calls with spacing of their own, text, and (where a tag
    opens calls) text then calls."""
    notation = syntax.notation
    if isinstance(notation, JsonNotation) and notation.name_is_key:
        spaced = syntax.prefix + '{ "now" :{ "a" : [1, "}"] } }' + syntax.suffix
    elif isinstance(notation, JsonNotation):
        number = f'"{notation.number_key}" : "7" ,' if notation.number_key else ""
        spaced = (syntax.prefix + '{ %s"%s" :"now",  "%s":{ "a" : [1, "}"] } }' % (
            number, notation.name_key, notation.arguments_key) + syntax.suffix)
    if isinstance(notation, XmlNotation):  # no spacing of its own: a text value that holds the syntax's strings
        spaced = syntax.render([("now", {"a": xml_strings(syntax)})])
    if isinstance(notation, NamedNotation):  # the name is outside the arguments: the spacing is theirs
        spaced = syntax.render([("now", ' { "a" : [1, "}"] } ')])
    if isinstance(notation, PythonicNotation):
        spaced = syntax.prefix + PYTHONIC_SPACED[0] + syntax.suffix
    if isinstance(notation, Gemma4Notation):
        spaced = syntax.prefix + GEMMA4_SPACED[0] + syntax.suffix
    outputs = [syntax.render([("get_weather", WEATHER)]),
               syntax.render([("get_weather", WEATHER), ("book_meeting", MEETING), ("now", {})]),
               spaced, "Sunny, I think.", "{" if syntax.start != "{" else "<", ""]
    if syntax.tag:
        outputs += ["Let me check " + syntax.tag[:-1] + ".\n" + syntax.render([("now", {})]),
                    syntax.tag[0] * 2 + syntax.render([("get_weather", WEATHER), ("now", {})]),
                    "Almost " + syntax.tag[:-1]]
    return outputs


def streamed(text: str, cuts: tuple[int, ...], syntax) -> tuple[str, list[dict], list]:
    """(content, calls as a client assembles them, the final calls) of `text` fed in pieces cut at `cuts`."""
    stream, content, calls = ToolStream(syntax, TOOL_DEFINITIONS), "", []
    bounds = [0, *cuts, len(text)]
    for start, end in zip(bounds, bounds[1:]):
        more, pieces = stream.feed(text[start:end])
        content += more
        for piece in pieces:
            if piece.opens:
                assert piece.index == len(calls)
                call = stream.call(piece.index)
                calls.append({"id": call.id, "name": call.function.name, "arguments": ""})
            calls[piece.index]["arguments"] += piece.arguments
    held, final = stream.finish()
    return content + held, calls, final


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
def test_every_division_into_two_or_three_pieces_streams_the_whole_parse(syntax):
    for text in rendered(syntax):
        whole_content, whole = parse_calls(text, syntax, TOOL_DEFINITIONS)
        for cuts in itertools.chain(itertools.combinations(range(1, len(text)), 1),
                                    itertools.combinations(range(1, len(text), 7), 2)):
            content, calls, final = streamed(text, cuts, syntax)
            if whole is None:
                assert (whole_content, content, calls, final) == (text, text, [], None)
                continue
            assert content == whole_content and text.startswith(content + syntax.start)
            assert [(c.id, c.function.name, c.function.arguments) for c in final] == \
                [(c["id"], c["name"], c["arguments"]) for c in calls]
            assert [(c.function.name, c.function.arguments) for c in whole] == \
                [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("syntax", TAGGED, ids=lambda s: s.name)
def test_text_before_a_tag_streams_at_once_and_only_what_may_open_a_call_is_held(syntax):
    stream, sent = ToolStream(syntax, TOOL_DEFINITIONS), []
    for piece in ["Let me ", "check", " " + syntax.tag[:3], syntax.tag[3:5] + "x", "\n"]:
        sent.append(stream.feed(piece)[0])
    assert sent == ["Let me ", "check", " ", syntax.tag[:5] + "x", "\n"]
    content, pieces = stream.feed(syntax.render([("now", {})]))
    assert content == "" and pieces == [CallPiece(0, "{}", opens=True)]
    assert stream.finish()[1][0].function.name == "now"


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
def test_arguments_are_the_value_as_written(syntax):
    [call] = parse_calls(syntax.render([("get_weather", WEATHER)]), syntax, TOOL_DEFINITIONS)[1]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", WEATHER)
    calls = parse_calls(rendered(syntax)[1], syntax, TOOL_DEFINITIONS)[1]
    assert [c.function.name for c in calls] == ["get_weather", "book_meeting", "now"]
    assert [json.loads(c.function.arguments) for c in calls] == [WEATHER, MEETING, {}]
    assert len({c.id for c in calls}) == 3
    [spaced] = parse_calls(rendered(syntax)[2], syntax, TOOL_DEFINITIONS)[1]
    notation = syntax.notation
    assert spaced.function.arguments == (
        json.dumps({"a": xml_strings(syntax)}, ensure_ascii=False) if isinstance(notation, XmlNotation)
        else PYTHONIC_SPACED[1] if isinstance(notation, PythonicNotation)
        else GEMMA4_SPACED[1] if isinstance(notation, Gemma4Notation) else '{ "a" : [1, "}"] }')


def test_the_name_goes_out_when_its_string_closes_and_the_arguments_as_they_grow():
    text = PLAIN.render([("get_weather", WEATHER)])
    stream, sent = ToolStream(PLAIN), []
    for i, c in enumerate(text):
        _, pieces = stream.feed(c)
        sent += [(i, p) for p in pieces]
    opened_at = text.index('"get_weather"') + len('"get_weather"') - 1
    assert sent[0][0] == opened_at and sent[0][1].opens and sent[0][1].arguments == ""
    assert len(sent) > len(json.dumps(WEATHER)) // 2  # the arguments came character by character
    assert "".join(p.arguments for _, p in sent) == json.dumps(WEATHER, ensure_ascii=False)


@pytest.mark.parametrize("syntax", [PLAIN, HERMES], ids=lambda s: s.name)
def test_an_output_cut_inside_a_call_keeps_the_calls_whose_names_were_written(syntax):
    text = syntax.render([("get_weather", WEATHER), ("now", {})])
    cut = text[:text.index('"Oslo') + 3]
    [call] = parse_calls(cut, syntax)[1]
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Os')
    before_name = text[:text.index('"get_weather"') + 5]
    assert parse_calls(before_name, syntax) == (before_name, None)
    assert streamed(before_name, (3,), syntax)[0] == before_name  # then the held text is the answer


@pytest.fixture(scope="module")
def vocab():
    return load_guided_vocabulary(DEFAULT_TARGET)


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
def test_sampled_calls_stream_as_they_parse(vocab, syntax):
    """Outputs the call grammar allows, cut where tokens end, as a served stream cuts them."""
    fmt = requested_tool_format(request(tool_choice="required"), syntax).format
    index = compile_regex(regex_for_format(fmt), vocab)
    dist = distances_to_final(index)
    for seed in range(10):
        rng = random.Random(seed)
        text = walk(index, vocab, dist, rng, stop_p=0.3).decode()
        _, whole = parse_calls(text, syntax, TOOL_DEFINITIONS)
        assert whole and {c.function.name for c in whole} <= {t["function"]["name"] for t in TOOLS}
        cuts = tuple(sorted(rng.sample(range(1, len(text)), min(12, len(text) - 1))))
        content, calls, _ = streamed(text, cuts, syntax)
        assert content == "" and [(c.function.name, c.function.arguments) for c in whole] == \
            [(c["name"], c["arguments"]) for c in calls]


def test_a_kimi_call_is_named_by_its_id():
    """Kimi K2 writes `functions.NAME:N`, which is the call's id as its template writes it back."""
    text = KIMI_K2.render([("get_weather", WEATHER), ("now", {})])
    assert "<|tool_call_begin|>functions.now:1<|tool_call_argument_begin|>{}<|tool_call_end|>" in text
    calls = parse_calls(text, KIMI_K2, TOOL_DEFINITIONS)[1]
    assert [(c.id, c.function.name) for c in calls] == [("functions.get_weather:0", "get_weather"),
                                                        ("functions.now:1", "now")]
    assert parse_calls(DEEPSEEK_V31.render([("now", {})]), DEEPSEEK_V31)[1][0].id.startswith("call")


def test_an_id_the_model_writes_twice_in_an_answer_is_made_fresh_the_second_time():
    """A client matches each tool result to a call by its id: two calls of one answer never share one."""
    kimi = KIMI_K2.render([("get_weather", WEATHER), ("get_weather", WEATHER)]).replace("weather:1", "weather:0")
    mistral = ('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}'
               '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Rome"}')
    for syntax, text, written_id in [(KIMI_K2, kimi, "functions.get_weather:0"),
                                     (MISTRAL_CALL_ID, mistral, "a1B2c3D4e")]:
        assert text.count(written_id) == 2
        first, second = parse_calls(text, syntax, TOOL_DEFINITIONS)[1]
        assert first.id == written_id and second.id.startswith("call_"), syntax.name
        first, second = streamed(text, (5, 40, 90), syntax)[1]
        assert first["id"] == written_id and second["id"].startswith("call_"), syntax.name


def test_mistral_small_32_calls_carry_the_ids_the_model_wrote():
    text = ('Let me check. [TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Oslo"}'
            "[TOOL_CALLS]now[CALL_ID]Z9y8X7w6v[ARGS]{}")
    content, calls = parse_calls(text, MISTRAL_CALL_ID, TOOL_DEFINITIONS)
    assert content == "Let me check. "
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("a1B2c3D4e", "get_weather", '{"city": "Oslo"}'), ("Z9y8X7w6v", "now", "{}")]
    content, calls = parse_calls(text.replace("[CALL_ID]a1B2c3D4e", "").replace("[CALL_ID]Z9y8X7w6v", ""),
                                 MISTRAL_ARGS, TOOL_DEFINITIONS)  # Devstral's: no id, so the server makes one
    assert [(c.function.name, c.id[:5]) for c in calls] == [("get_weather", "call_"), ("now", "call_")]
