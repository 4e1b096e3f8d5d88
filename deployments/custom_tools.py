"""OpenAI's custom tools: a tool whose call carries one free text, its `input`, instead of JSON
arguments, unconstrained (`format: text`) or in a grammar (`format: grammar`, Lark's syntax or a
regex), as a code agent's `apply_patch` takes a patch.

Open models' chat templates know function tools only, so a request's custom tools reach the
template, and the tool-call grammar (deployments/tool_calls.py), as functions of one string
parameter, `input`, whose schema's `pattern` is the grammar's regex (app/guided/lark_grammar.py).
Every notation then writes, and its reader reads, a custom call as it writes any function's call,
and the call's input is its `input` argument, taken back out of the JSON arguments here, whole or
as they stream. A custom call fed back in the messages becomes that function's call again.
"""

from __future__ import annotations

import json
import re

from app.guided.errors import GuidedFormatError
from app.guided.lark_grammar import lark_regex
from app.guided.regex_check import check_regex
from deployments.tool_protocol import (AllowedToolsChoice, CustomCall, CustomTool, CustomToolCall, CustomToolDefinition,
                                       FunctionCall, FunctionDefinition, FunctionName, GrammarFormat,
                                       NamedCustomToolChoice, NamedToolChoice, ToolCall, ToolDefinition)

INPUT = "input"  # the one parameter of the function a custom tool is written as
_INPUT_OPENS = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_STRING_BODY = re.compile(r'(?:[^"\\]|\\.)*')
# a \u escape cut short, or a high surrogate's whose low half is still to come, after an odd run of backslashes
_ESCAPE_AT_END = re.compile(r'(\\+)u(?:[0-9a-fA-F]{0,3}|[dD][89abAB][0-9a-fA-F]{2})$')


def as_function(tool: CustomTool) -> ToolDefinition:
    """The function a custom tool is offered to the model as; ValueError for a grammar that cannot be
    enforced."""
    schema = {"type": "string", "description": "The tool's input, as free text."}
    if isinstance(tool.format, GrammarFormat):
        grammar = tool.format.grammar
        try:
            schema["pattern"] = (lark_regex(grammar.definition) if grammar.syntax == "lark"
                                 else check_regex(grammar.definition))
        except GuidedFormatError as exc:
            raise ValueError(f"custom tool {tool.name!r}: its {grammar.syntax} grammar: {exc}") from None
        kind = "Lark grammar" if grammar.syntax == "lark" else "regular expression"
        schema["description"] = f"The tool's input: text in this {kind}:\n{grammar.definition}"
    parameters = {"type": "object", "properties": {INPUT: schema}, "required": [INPUT], "additionalProperties": False}
    function = ToolDefinition(function=FunctionDefinition(name=tool.name, description=tool.description,
                                                          parameters=parameters))
    function._custom = True
    return function


def as_functions(tools: list[ToolDefinition | CustomToolDefinition] | None) -> list[ToolDefinition] | None:
    """The tools with each custom one as its function."""
    return None if tools is None else [as_function(t.custom) if isinstance(t, CustomToolDefinition) else t
                                       for t in tools]


def function_choice(choice, tools: list[ToolDefinition] | None):
    """`tool_choice` with a custom tool named as its function; ValueError where a name's kind is not its tool's."""
    custom_names = {t.function.name for t in tools or () if t.is_custom}
    if isinstance(choice, AllowedToolsChoice):
        named = [function_choice(t, tools) for t in choice.allowed_tools.tools]
        return choice.model_copy(update={"allowed_tools": choice.allowed_tools.model_copy(update={"tools": named})})
    if isinstance(choice, NamedCustomToolChoice):
        if choice.custom.name not in custom_names:
            raise ValueError(f"tool_choice names the custom tool {choice.custom.name!r}, which is not a custom "
                             "tool of this request")
        return NamedToolChoice(function=FunctionName(name=choice.custom.name))
    if isinstance(choice, NamedToolChoice) and choice.function.name in custom_names:
        raise ValueError(f"tool_choice names {choice.function.name!r} as a function; it is a custom tool "
                         '({"type": "custom", "custom": {"name": ...}})')
    return choice


def function_call(call: ToolCall | CustomToolCall) -> ToolCall:
    """A call fed back in the messages as the model wrote it: a custom call as its function's."""
    if isinstance(call, ToolCall):
        return call
    arguments = json.dumps({INPUT: call.custom.input}, ensure_ascii=False)
    return ToolCall(id=call.id, function=FunctionCall(name=call.custom.name, arguments=arguments))


def custom_call(call: ToolCall) -> CustomToolCall:
    """The custom call a call of a custom tool's function is."""
    return CustomToolCall(id=call.id, custom=CustomCall(name=call.function.name,
                                                        input=input_of(call.function.arguments)))


def input_of(arguments: str) -> str:
    """The input in a custom call's JSON arguments, or as much of it as they hold (a call cut by
    `max_tokens`)."""
    try:
        value = json.loads(arguments).get(INPUT)
    except (json.JSONDecodeError, AttributeError):
        value = None
    return value if isinstance(value, str) else InputStream().feed(arguments)


def _whole_characters(arguments: str, start: int) -> tuple[str, int] | None:
    """The characters that the JSON string's text from `start` holds whole (up to its closing quote, or
    its last complete character), and where they end in `arguments`; None for an escape JSON does not
    have, after which nothing is sure."""
    body = _STRING_BODY.match(arguments, start).group()  # stops before a lone backslash at the end
    while (cut := _ESCAPE_AT_END.search(body)) and len(cut.group(1)) % 2:  # `\ud83d\u`: both go
        body = body[:cut.end(1) - 1]
    try:
        return json.loads(f'"{body}"', strict=False), start + len(body)
    except json.JSONDecodeError:
        return None


class InputStream:
    """A streamed custom call's input: what its arguments add to it, piece by piece. Each piece is
    decoded once: only the arguments' text not yet decoded is kept (a stream's work grows with its
    length, not with its length squared)."""

    def __init__(self):
        self.undecoded, self.opened, self.ended = "", False, False

    def feed(self, more_arguments: str) -> str:
        if self.ended:
            return ""
        self.undecoded += more_arguments
        if not self.opened:
            opened = _INPUT_OPENS.match(self.undecoded)
            if opened is None:
                return ""
            self.undecoded, self.opened = self.undecoded[opened.end():], True
        whole = _whole_characters(self.undecoded, 0)
        if whole is None:
            self.ended = True
            return ""
        more, end = whole
        self.undecoded = self.undecoded[end:]
        self.ended = self.undecoded.startswith('"')
        return more
