"""Tool-call grammars, parsing and template rendering, without an app.

Random walks of each tool-call grammar over the default vocabulary (see
tests/guided/test_string_formats.py) must parse back into calls whose arguments validate
against their tool's schema, in every convention; the served tests (tests/serve/tool_call_cases.py)
check the same through the model and the openai client."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from transformers import AutoTokenizer

from app.guided.compiler import compile_regex, regex_for_format
import deployments.builder as builder
from app.guided.vocabulary import load_guided_vocabulary
from deployments.chat_prompt import chat_prompt_ids
from deployments.chat_protocol import ChatCompletionRequest
from deployments.tool_call_stream import parse_calls
from deployments.tool_calls import (APERTUS, COHERE_COMMAND3, DEEPSEEK_V3, DEEPSEEK_V31, DEEPSEEK_V32, GIGACHAT31,
                                    GLM45, GLM47, GRANITE, GRANITE_20B_FC, HERMES, INTERNLM, JAMBA, KIMI_K2, LFM2, LLAMA3,
                                    MINIMAX_M1, MINIMAX_M2, MISTRAL, MISTRAL_ARGS, MISTRAL_CALL_ID, NEMOTRON_V2,
                                    OLMO3, PHI4_MINI, PLAIN, PYTHONIC, QWEN3_CODER, SEED_OSS, STEP3, XLAM,
                                    TEMPLATE_MARKERS, TOOL_CALL_PARSERS, ToolCallSyntax, mistral_call_id,
                                    render_messages, requested_tool_format, syntax_for_template, tool_call_syntax)
from deployments.guided_formats import FormatRequestError
from deployments.openai_errors import OpenAIError
from tests.checkpoints import DEFAULT_TARGET
from tests.guided.test_string_formats import CHECKER, accepts, distances_to_final, walk

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]},
                                     "country": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}},
    "required": ["city", "unit"]}}}
BOOK = {"type": "function", "function": {"name": "book_meeting", "parameters": {
    "type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "people": {"type": "array", "items": {"type": "object", "properties": {
            "email": {"type": "string", "format": "email"}, "optional": {"type": "boolean"}},
            "required": ["email", "optional"]}, "minItems": 1, "maxItems": 3},
        "room": {"type": "object", "properties": {"floor": {"type": "integer"},
                                                   "name": {"type": "string", "maxLength": 8}},
                 "required": ["floor"]}},
    "required": ["when", "people", "room"]}}}
NO_ARGS = {"type": "function", "function": {"name": "now"}}
TOOLS = [WEATHER, BOOK, NO_ARGS]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"})
           for t in TOOLS}


@pytest.fixture(scope="module")
def vocab():
    return load_guided_vocabulary(DEFAULT_TARGET)


def request(**kwargs) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, **kwargs)


TOOL_DEFINITIONS = request().tools  # what a call written as XML parameters is read against
# every convention the app knows, once; harmony replies are messages, not text and calls: tests/test_harmony.py
SYNTAXES = [s for s in dict.fromkeys(TOOL_CALL_PARSERS.values()) if not s.harmony]
TAGGED = [s for s in SYNTAXES if s.tag]


def allowed_tools(mode: str, *names: str) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": name}} for name in names]}}


# the functions each tool_choice lets a call be of
CHOICES = {"required": None, "auto": None, "named": ({"type": "function", "function": {"name": "book_meeting"}},
                                                     {"book_meeting"}),
           "allowed_required": (allowed_tools("required", "book_meeting", "now"), {"book_meeting", "now"})}


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
@pytest.mark.parametrize("choice_name", CHOICES)
def test_sampled_calls_parse_and_validate(vocab, syntax, choice_name):
    choice, allowed = CHOICES[choice_name] or (choice_name, None)
    fmt = requested_tool_format(request(tool_choice=choice), syntax).format
    index = compile_regex(regex_for_format(fmt), vocab)
    dist = distances_to_final(index)
    calls_seen = 0
    for seed in range(25):
        text = walk(index, vocab, dist, random.Random(seed), stop_p=0.3).decode()
        content, calls = parse_calls(text, syntax, TOOL_DEFINITIONS)
        if choice == "auto" and calls is None:
            assert content == text and (syntax.tag not in text if syntax.tag else not text.startswith(syntax.start))
            continue
        assert calls, text
        assert text.startswith(content) and text[len(content):].startswith(syntax.start)
        assert content == "" or choice == "auto" and syntax.tag
        calls_seen += 1
        for call in calls:
            assert allowed is None or call.function.name in allowed, call
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name],
                                format_checker=CHECKER)
    assert calls_seen >= 5 or choice == "auto"  # auto: uniform walks rarely open a call


def auto_index(syntax, vocab):
    return compile_regex(regex_for_format(requested_tool_format(request(tool_choice="auto"), syntax).format), vocab)


@pytest.mark.parametrize("syntax", [PLAIN, XLAM, LLAMA3, PYTHONIC], ids=lambda s: s.name)
def test_auto_without_a_tag_is_text_or_a_whole_call(vocab, syntax):
    """Checked on the compiled automaton, not with Python's `re`: outlines-core's can refuse what
    `re` allows (app/guided/compiler.py: compile_regex)."""
    index = auto_index(syntax, vocab)
    call = syntax.render([("get_weather", {"city": "Oslo", "unit": "celsius"})])
    two = syntax.render([("get_weather", {"city": "Oslo", "unit": "celsius"}), ("now", {})])
    for text in [call, two, "Sunny, I think.", "S", "Sunny: " + call]:
        assert accepts(index, vocab, text), text
    for text in ["", syntax.start + "oops", syntax.render([("get_weather", {"city": "Oslo"})]), call + " done"]:
        assert not accepts(index, vocab, text), text


@pytest.mark.parametrize("syntax", TAGGED, ids=lambda s: s.name)
def test_auto_with_a_tag_is_text_then_calls(vocab, syntax):
    """Qwen's and Hermes' way: a sentence, then the calls; the text cannot hold the tag."""
    index = auto_index(syntax, vocab)
    call = syntax.render([("get_weather", {"city": "Oslo", "unit": "celsius"})])
    two = syntax.render([("get_weather", {"city": "Oslo", "unit": "celsius"}), ("now", {})])
    tag = syntax.tag
    for text in ["Sunny, I think.", "Let me check.\n", "a " + tag[:-1] + " b", tag[0] * 3 + tag[1:-1],
                 "\u00e9" + tag[0] + tag[2:], tag[:-1], tag[0]]:
        assert accepts(index, vocab, text) and accepts(index, vocab, text + call), text
    several = not syntax.one_call  # GigaChat 3.1's: one call a reply
    assert accepts(index, vocab, call) and accepts(index, vocab, two) is several
    assert accepts(index, vocab, "Sure. " + two) is several and accepts(index, vocab, "Sure. " + call)
    for text in ["", "a " + tag + " b", tag[0] + tag + "oops", call + " and then text",
                 syntax.render([("get_weather", {"city": "Oslo"})])]:
        assert not accepts(index, vocab, text), text


def test_a_tag_whose_first_character_recurs_is_refused():
    """The text grammar before calls relies on it."""
    with pytest.raises(ValueError, match="recur"):
        ToolCallSyntax("bad", "<a<", "", "", tag="<a<")


def test_parallel_calls_are_bounded_and_single_when_off():
    many = requested_tool_format(request(tool_choice="required"), PLAIN).format["pattern"]
    one = requested_tool_format(request(tool_choice="required", parallel_tool_calls=False),
                                PLAIN).format["pattern"]
    call = json.dumps({"name": "now", "arguments": {}})
    assert re.fullmatch(many, "\n".join([call] * 4)) and not re.fullmatch(many, "\n".join([call] * 5))
    assert re.fullmatch(one, call) and not re.fullmatch(one, call + "\n" + call)



def test_a_convention_whose_template_writes_one_call_makes_one_whatever_parallel_tool_calls():
    """GigaChat 3.1's template writes only a message's first call."""
    pattern = requested_tool_format(request(tool_choice="required", parallel_tool_calls=True), GIGACHAT31).format
    call = '<|function_call|>{"name": "now", "arguments": {}}'
    assert re.fullmatch(pattern["pattern"], call) and not re.fullmatch(pattern["pattern"], call + call[17:])


@pytest.mark.parametrize("kwargs, param, message", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tool_choice": allowed_tools("auto", "now", "nope")}, "tool_choice", "nope"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "unique"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "patternProperties": {"^a": {}}}}}]}, "tools", "patternProperties"),
])
@pytest.mark.parametrize("syntax", [PLAIN, QWEN3_CODER], ids=lambda s: s.name)
def test_bad_tool_requests_name_the_field(kwargs, param, message, syntax):
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}],
                                **{"tools": TOOLS, **kwargs})
    with pytest.raises(FormatRequestError, match=message) as info:
        requested_tool_format(req, syntax)
    assert info.value.param == param


# Qwen3.5's way of writing an assistant turn's calls (its tool parts, written here).
QWEN35_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{% for k, v in c.function.arguments | items %}<parameter={{ k }}>\n"
    "{{ v if v is string else v | tojson }}\n</parameter>\n{% endfor %}</function>\n</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")

# GLM-4.5's and GLM-4.7's (their tool parts, written here; transformers trims the newline after a tag).
GLM45_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% for c in m.tool_calls or [] %}\n"
    "{{ '\\n<tool_call>' + c.function.name }}\n{% for k, v in c.function.arguments.items() %}\n"
    "<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v | tojson if v is not string else v }}</arg_value>\n"
    "{% endfor %}\n</tool_call>{% endfor %}{% endfor %}<|assistant|>")
GLM47_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% for c in m.tool_calls or [] %}"
    "{{- '<tool_call>' ~ c.function.name -}}{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>"
    "<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>{% endfor %}</tool_call>"
    "{% endfor %}{% endfor %}<|assistant|>")


def test_syntax_follows_the_template():
    assert syntax_for_template("{{ '<tool_call>' }}") is HERMES
    assert syntax_for_template(QWEN35_TEMPLATE) is QWEN3_CODER  # its calls open with <tool_call> too
    assert syntax_for_template(GLM45_TEMPLATE) is GLM45 and syntax_for_template(GLM47_TEMPLATE) is GLM47
    assert syntax_for_template("[TOOL_CALLS]") is MISTRAL
    assert syntax_for_template(MISTRAL_ARGS_TEMPLATE) is MISTRAL_ARGS  # Devstral's, Magistral's, Ministral 3's
    assert syntax_for_template(MISTRAL_CALL_ID_TEMPLATE) is MISTRAL_CALL_ID  # Mistral Small 3.2's
    assert syntax_for_template("<|python_tag|>") is LLAMA3
    # vLLM's Llama 3.2 and Llama 4 pythonic templates teach the list in prose and hold `ipython` too
    pythonic = ("{{- \"the format of [func_name1(params_name1=params_value1, params_name2=params_value2...), "
                "func_name2(params)]\\n\" }}{%- if message.role == \"ipython\" %}")
    assert syntax_for_template(pythonic) is PYTHONIC
    assert syntax_for_template("{{- '<|tool_call|>' + message.tool_calls | tojson }}") is GRANITE
    assert syntax_for_template("<tool_calls>{{ calls }}</tool_calls>") is JAMBA
    apriel = ("Return all function calls as a list of json objects within <tool_call></tool_call> XML tags."
              "{{- '\\n<tool_calls>[' -}}")  # Apriel 1.5's: it asks for one form and writes the other
    assert syntax_for_template(apriel) is JAMBA
    assert syntax_for_template("{{- '<TOOLCALL>[' -}}{{- ']</TOOLCALL>' -}}") is NEMOTRON_V2
    assert syntax_for_template('{{- "<|tool_call_start|>[" + calls + "]<|tool_call_end|>" -}}') is LFM2
    assert syntax_for_template('"List of tools: <|tool_list_start|>["') is LFM2  # LFM2's first: no calls written
    assert syntax_for_template('function_call="<|function_call|>"') is GIGACHAT31
    assert syntax_for_template('<|CHATBOT_TOKEN|><|START_THINKING|>{{ plan }}<|END_THINKING|><|START_ACTION|>[') \
        is COHERE_COMMAND3
    assert syntax_for_template("ai name=MiniMax AI\n<tool_calls>\n{{ call | tojson }}\n</tool_calls>") is MINIMAX_M1
    assert syntax_for_template("<|function_call_library|>{{ tools | tojson }}") is GRANITE_20B_FC
    assert syntax_for_template("prefix function calls with functools marker") is PHI4_MINI
    assert syntax_for_template("wrapped in <function_calls></function_calls> XML tags") is OLMO3
    assert syntax_for_template("{{- '<|tools_prefix|>' + calls | tojson + '<|tools_suffix|>' }}") is APERTUS
    assert syntax_for_template("<|im_start|>system name=<|plugin|>\n{{ tools | tojson }}") is INTERNLM
    assert syntax_for_template(None) is PLAIN
    v3 = "{{'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json'"
    assert syntax_for_template(v3) is DEEPSEEK_V3
    assert syntax_for_template("{{'<｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>'") is DEEPSEEK_V31
    assert syntax_for_template("<|tool_calls_section_begin|>{%- for tool_call in message['tool_calls'] -%}") is KIMI_K2
    assert syntax_for_template("{{- '<minimax:tool_call>' ~ '\\n' }}{{- '<invoke name=\"' + name }}") is MINIMAX_M2
    assert syntax_for_template("{{ '<seed:tool_call>\\n<function=' + tool_call.function.name }}") is SEED_OSS
    step3 = "<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"{{ name }}\">"
    assert syntax_for_template(step3) is STEP3
    assert syntax_for_template("{%- set dsml_token = '｜DSML｜' -%}{{ '<' + dsml_token + 'invoke' }}") is DEEPSEEK_V32
    assert {name: s.name for name, s in TOOL_CALL_PARSERS.items() if name != s.name} == {"hunyuan_a13b": "jamba",
                                                                                          "qwen3_xml": "qwen3_coder",
                                                                                          "llama4_pythonic": "pythonic",
                                                                                          "ernie45": "hermes"}
    assert {"glm45", "glm47", "qwen3_coder"} <= set(TOOL_CALL_PARSERS)


def test_no_template_marker_is_shadowed_by_an_earlier_one():
    for markers, syntax in TEMPLATE_MARKERS:
        assert syntax_for_template(" ".join(markers)) is syntax, markers


def test_the_apps_tool_call_parser_wins_over_the_template(monkeypatch):
    monkeypatch.setattr(builder, "cluster_gpus", lambda: 0.0)
    ingress = builder.build_app({"model": "checkpoints/tiny-target", "tool_call_parser": "granite"})._bound_deployment
    assert ingress.init_kwargs["tool_syntax"] is GRANITE
    assert builder.build_app({"model": "checkpoints/tiny-target"})._bound_deployment.init_kwargs["tool_syntax"] is PLAIN
    assert tool_call_syntax("granite", "{{ '<tool_call>' }}") is GRANITE
    assert tool_call_syntax(None, "{{ '<tool_call>' }}") is HERMES


def test_tool_call_parser_mistral_reads_the_form_of_mistrals_that_the_template_writes():
    assert tool_call_syntax("mistral", MISTRAL_ARGS_TEMPLATE) is MISTRAL_ARGS
    assert tool_call_syntax("mistral", MISTRAL_CALL_ID_TEMPLATE) is MISTRAL_CALL_ID
    assert tool_call_syntax("mistral", "[TOOL_CALLS]") is tool_call_syntax("mistral", None) is MISTRAL
    assert tool_call_syntax("mistral", "{{ '<tool_call>' }}") is MISTRAL
    assert tool_call_syntax("mistral_args", None) is MISTRAL_ARGS


MISTRAL_ARGS_TEMPLATE = "{{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}"
MISTRAL_CALL_ID_TEMPLATE = ("{{- '[TOOL_CALLS]' + tool_call.function.name }}{{- '[CALL_ID]' + tool_call.id }}"
                            "{{- '[ARGS]' + tool_call['function']['arguments']|tojson }}")
# Mistral Small 3.2's and Mistral Nemo's check of call ids, and the calls and results around it (written here)
MISTRAL_TEMPLATE = (
    "{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}{%- for c in m.tool_calls %}"
    "{%- if c.id is not string or c.id|length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings"
    " with length 9!') }}{% endif %}[TOOL_CALLS]{{ c.function.name }}[CALL_ID]{{ c.id }}[ARGS]"
    "{{ c.function.arguments | tojson }}{% endfor %}</s>"
    "{%- elif m.role == 'tool' %}{%- if m.tool_call_id|length != 9 %}{{ raise_exception('Tool call IDs should be "
    "alphanumeric strings with length 9!') }}{% endif %}[TOOL_RESULTS]{{ m.tool_call_id }}[TOOL_CONTENT]"
    "{{ m.content }}[/TOOL_RESULTS]{%- endif %}{%- endfor %}")


def test_mistral_templates_get_call_ids_of_nine_letters_and_digits_the_same_for_a_call_and_its_result():
    """A client's ids are OpenAI's `call_...` (or this server's), which Mistral's templates refuse."""
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    tok.chat_template = MISTRAL_TEMPLATE
    text = tok.decode(chat_prompt_ids(tok, conversation(), MISTRAL_CALL_ID, native_tools=True))
    short = mistral_call_id("call_1")
    assert len(short) == 9 and short.isascii() and short.isalnum()
    assert f"[CALL_ID]{short}[ARGS]" in text and f"[TOOL_RESULTS]{short}[TOOL_CONTENT]" in text
    assert mistral_call_id("a1B2c3D4e") == "a1B2c3D4e"  # already one: as the model wrote it
    assert len({mistral_call_id(f"call_{n}") for n in range(1000)}) == 1000
    with pytest.raises(OpenAIError, match="length 9"):  # another convention's ids are the client's
        chat_prompt_ids(tok, conversation(), HERMES, native_tools=True)


def conversation() -> ChatCompletionRequest:
    return ChatCompletionRequest(tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 3}'},
    ])


def test_default_template_gets_calls_as_text_and_tools_described():
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    req = conversation()
    messages = render_messages(req.messages, req.tools, PLAIN, native=False)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    call = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    assert call in text and '{"temp": 3}' in text and '"get_weather"' in text.split(call)[0]
    assert parse_calls(call, PLAIN)[1][0].function.arguments == '{"city": "Oslo", "unit": "celsius"}'


def test_native_template_gets_tool_calls_with_object_arguments():
    """A Qwen2.5-style template (its tool parts, written here) renders the call and result."""
    template = (
        "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", "
        "\"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}"
        "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    req = conversation()
    messages = render_messages(req.messages, req.tools, HERMES, native=True)
    text = tok.apply_chat_template(messages, tools=[WEATHER], chat_template=template, tokenize=False)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n</tool_call>'
    assert call in text and "<|im_start|>tool\n{\"temp\": 3}" in text
    assert parse_calls(call, HERMES)[1][0].function.name == "get_weather"


def test_a_template_that_adds_arguments_to_a_string_gets_them_as_text():
    """DeepSeek V3.1's template (its tool-call part, written here) adds a call's arguments to its
    markers, which an object would make a TypeError: it gets the client's JSON text, and writes the
    call as the grammar does."""
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    tok.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content or '' }}{% if m.tool_calls %}<｜tool▁calls▁begin｜>"
        "{% for tool in m.tool_calls %}{{ '<｜tool▁call▁begin｜>' + tool['function']['name'] + '<｜tool▁sep｜>'"
        " + tool['function']['arguments'] + '<｜tool▁call▁end｜>' }}{% endfor %}<｜tool▁calls▁end｜>{% endif %}"
        "<|end|>\n{% endfor %}{% if tools %}{{ tools | length }} tools{% endif %}<|assistant|>\n")
    req = conversation()
    text = tok.decode(chat_prompt_ids(tok, req, DEEPSEEK_V31, native_tools=True))
    assert DEEPSEEK_V31.render([("get_weather", {"city": "Oslo", "unit": "celsius"})]) in text
    assert "1 tools" in text


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_fed_back_reasoning_reaches_a_template_that_renders_it(field):
    """Qwen3-style: the template writes an assistant turn's `reasoning_content` in <think>."""
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
                "{{ m.content }}<|im_end|>\n{% endfor %}")
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", field: "Add them."}]})
    messages = render_messages(req.messages, None, HERMES, native=True)
    text = AutoTokenizer.from_pretrained(DEFAULT_TARGET).apply_chat_template(
        messages, chat_template=template, tokenize=False)
    assert "<|im_start|>assistant\n<think>\nAdd them.\n</think>\n\n4<|im_end|>" in text


def test_allowed_tools_under_auto_is_text_or_calls_of_those_tools_only():
    pattern = requested_tool_format(request(tool_choice=allowed_tools("auto", "now")), PLAIN).format["pattern"]
    now, weather = (PLAIN.render([call]) for call in [("now", {}), ("get_weather", {"city": "Oslo",
                                                                                   "unit": "celsius"})])
    assert re.fullmatch(pattern, now) and re.fullmatch(pattern, "Sunny.") and not re.fullmatch(pattern, weather)
    prompt_tools = render_messages(request().messages, TOOL_DEFINITIONS, PLAIN, native=False)[0]["content"]
    assert "get_weather" in prompt_tools  # every tool stays in the prompt
