"""How one tool call is written inside a syntax's prefix, separators and suffix (deployments/tool_calls.py):
each notation gives a call's grammar, its text as the chat template writes it back, the strings it writes
around its parts, and the reader that streams it into OpenAI's JSON arguments
(deployments/tool_call_stream.py). A syntax holds one notation, so no code asks which one it is.

- JsonNotation: a JSON object, `{"name": ..., "arguments": {...}}` (or Llama 3's "parameters", or
  Apertus' `{"name": {...}}`, or Cohere's `{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}`);
- XmlNotation: XML parameters (deployments/xml_tool_calls.py);
- NamedNotation: JSON arguments after a name between markers (deployments/named_tool_calls.py);
- PythonicNotation: a Python call (deployments/pythonic_tool_calls.py);
- Gemma4Notation: Gemma 4's own notation (deployments/gemma4_tool_calls.py);
- HarmonyNotation: a message of a harmony reply (deployments/harmony.py), read with the rest of the
  reply, not by a reader of its own.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar, Protocol

from app.guided.compiler import regex_for_format
from deployments import gemma4_tool_calls, harmony, pythonic_tool_calls
from deployments.gemma4_tool_call_reader import Gemma4CallReader
from deployments.json_tool_call_reader import JsonCallReader
from deployments.named_tool_call_reader import NamedCallReader
from deployments.named_tool_calls import CALL_NUMBER, NamedJsonCall, named_call_regex
from deployments.pythonic_tool_call_reader import PythonicCallReader
from deployments.tool_protocol import ToolDefinition
from deployments.written_call import WrittenCall
from deployments.xml_tool_call_reader import XmlCallReader
from deployments.xml_tool_calls import XmlParameters, xml_call_regex


class CallReader(Protocol):
    """A choice's calls read a piece at a time, from the syntax's prefix on."""
    text: str
    calls: list[WrittenCall]

    def read(self, more: str) -> None: ...

    def arguments(self, call: WrittenCall, after: int = 0) -> str: ...


class CallNotation(Protocol):
    """How a call is written (the module's docstring lists them)."""
    start: str  # what every call begins with ("": its function's name, after the syntax's prefix)
    markers: tuple[str, ...]  # what it writes around a call's parts (deployments/markup_tokens.py)

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        """A call as the template writes it; arguments that were not a JSON object go in as the client sent
        them. `number`: the call's place in the reply, which some notations write."""

    def regex(self, tools: list[ToolDefinition]) -> str:
        """One call of any of `tools`; GuidedFormatError for a schema that cannot be enforced."""

    def reader(self, prefix: str, tools: list[ToolDefinition] | None) -> CallReader:
        """A reader of calls written after `prefix` (the syntax's); `tools` type XML parameters' values."""


def _schema_regex(schema: dict) -> str:
    return regex_for_format({"type": "json_schema", "json_schema": {"schema": schema}})


@dataclass(frozen=True)
class JsonNotation:
    arguments_key: str = "arguments"  # or Llama 3's and InternLM's "parameters"
    name_is_key: bool = False  # a call is `{"name": {arguments}}`, not `{"name": ..., "arguments": ...}`
    name_key: str = "name"  # or Cohere's "tool_name"
    number_key: str = ""  # a key before the name whose value is the call's number as a string (Cohere's)
    start: ClassVar[str] = "{"
    markers: ClassVar[tuple[str, ...]] = ()

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        if self.name_is_key:
            return json.dumps({name: arguments}, ensure_ascii=False)
        numbered = {self.number_key: str(number)} if self.number_key else {}
        return json.dumps({**numbered, self.name_key: name, self.arguments_key: arguments}, ensure_ascii=False)

    def regex(self, tools: list[ToolDefinition]) -> str:
        schemas = [self._call_schema(t) for t in tools]
        return _schema_regex(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})

    def _call_schema(self, tool: ToolDefinition) -> dict:
        name = tool.function.name
        if self.name_is_key:
            return {"type": "object", "properties": {name: tool.function.schema_}, "required": [name]}
        numbered = {self.number_key: {"type": "string", "pattern": CALL_NUMBER}} if self.number_key else {}
        properties = {**numbered, self.name_key: {"const": name}, self.arguments_key: tool.function.schema_}
        return {"type": "object", "properties": properties, "required": list(properties)}

    def reader(self, prefix: str, tools: list[ToolDefinition] | None) -> CallReader:
        return JsonCallReader(self.arguments_key, self.name_is_key, self.name_key)


def _strings(parts) -> tuple[str, ...]:
    return tuple(s for s in dataclasses.astuple(parts) if s and isinstance(s, str))


@dataclass(frozen=True)
class XmlNotation:
    parameters: XmlParameters

    @property
    def start(self) -> str:
        return self.parameters.function_open

    @property
    def markers(self) -> tuple[str, ...]:
        return _strings(self.parameters)

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        return self.parameters.render(name, arguments)

    def regex(self, tools: list[ToolDefinition]) -> str:
        return xml_call_regex(tools, self.parameters)

    def reader(self, prefix: str, tools: list[ToolDefinition] | None) -> CallReader:
        return XmlCallReader(self.parameters, tools)


@dataclass(frozen=True)
class NamedNotation:
    form: NamedJsonCall

    @property
    def start(self) -> str:
        return self.form.call_open

    @property
    def markers(self) -> tuple[str, ...]:
        return _strings(self.form)

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        return self.form.render(name, arguments, number)

    def regex(self, tools: list[ToolDefinition]) -> str:
        return named_call_regex(tools, self.form)

    def reader(self, prefix: str, tools: list[ToolDefinition] | None) -> CallReader:
        return NamedCallReader(self.form)


@dataclass(frozen=True)
class PythonicNotation:
    start: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        return pythonic_tool_calls.render_call(name, arguments)

    def regex(self, tools: list[ToolDefinition]) -> str:
        return pythonic_tool_calls.pythonic_call_regex(tools)

    def reader(self, prefix: str, tools: list[ToolDefinition] | None) -> CallReader:
        return PythonicCallReader(prefix)


@dataclass(frozen=True)
class Gemma4Notation:
    start: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = (gemma4_tool_calls.QUOTE,)

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        return gemma4_tool_calls.render_call(name, arguments)

    def regex(self, tools: list[ToolDefinition]) -> str:
        return gemma4_tool_calls.gemma4_call_regex(tools)

    def reader(self, prefix: str, tools: list[ToolDefinition] | None) -> CallReader:
        return Gemma4CallReader()


@dataclass(frozen=True)
class HarmonyNotation:
    """A call is a message of its own; its reply is read whole, calls and all, by harmony.HarmonyReply,
    and its markers are the reply's, the syntax's strings left out (`<|call|>` ends the reply)."""
    start: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = harmony.MARKERS

    def render(self, name: str, arguments: dict | str, number: int) -> str:
        return harmony.call_header(name) + (arguments if isinstance(arguments, str)
                                            else json.dumps(arguments, ensure_ascii=False))

    def regex(self, tools: list[ToolDefinition]) -> str:
        return harmony.calls_regex([(t.function.name, _schema_regex(t.function.schema_)) for t in tools])


JSON_CALL = JsonNotation()
PYTHONIC_CALL = PythonicNotation()
GEMMA4_CALL = Gemma4Notation()
HARMONY_CALL = HarmonyNotation()
