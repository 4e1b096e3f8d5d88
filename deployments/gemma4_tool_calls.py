"""Tool calls in Gemma 4's own notation, as its chat template writes a call back (vLLM's `gemma4`
parser reads the same):

    <|tool_call>call:get_weather{city:<|"|>Oslo<|"|>,days:3,units:{metric:true}}<tool_call|>

Keys are bare, strings are raw text between `<|"|>` marks (a special token: no escapes), numbers
and `true`/`false` are JSON's, lists and objects are JSON's brackets with no spacing, and the
template writes every object's keys sorted (Jinja's `dictsort`, case aside). The calls are
generated under `gemma4_call_regex`, built here from each tool's parameter schema: its
properties in that order, the required ones always. A string's `pattern` or `format` keeps
outlines-core's regex for it, without JSON's quotes; a string with a length bound cannot hold
`<`. They are read back, into OpenAI's JSON arguments, by
deployments/gemma4_tool_call_reader.py.
"""

from __future__ import annotations

import json
import re

from app.guided.compiler import escape_literal, regex_for_format
from app.guided.errors import GuidedFormatError
from deployments.parameter_schema import lists_no_parameters, object_parameters
from deployments.text_regex import in_order, one_of, text_without
from deployments.tool_protocol import FunctionDefinition, ToolDefinition

QUOTE = '<|"|>'
BARE_KEY = r"[A-Za-z_][A-Za-z0-9_.\-]*"  # what a key may be: the reader ends it at `:`
FREE_KEY = r"[A-Za-z_][A-Za-z0-9_]{0,63}"  # for an object whose schema lists no properties
UNTYPED_DEPTH = 2  # how deep a value with no type may nest (a regex cannot count brackets)
MAX_REF_DEPTH = 4  # how many `$ref`s may be followed one inside another (a recursive schema: refused)
_QUOTE = escape_literal(QUOTE)
_TEXT = text_without(QUOTE)
_BOUNDED_CHAR = "[^<]"  # a character of a string with a length bound (text_without cannot count)
_IMPLIED_TYPES = {"object": ("properties", "additionalProperties", "required"),
                  "array": ("items", "prefixItems", "minItems", "maxItems"),
                  "string": ("pattern", "format", "minLength", "maxLength")}  # what a schema without a type is


def gemma4_literal(value) -> str:
    """A JSON value in Gemma 4's notation (a const or enum value, and how its template writes one)."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ",".join(gemma4_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma4_literal(value[k])}" for k in sorted(value, key=str.lower)) + "}"
    return json.dumps(value)


def _comma_list(item: str) -> str:
    """Any number of `item`s, none included, joined by commas (the notation's lists and free members)."""
    return f"(?:{item}(?:,{item})*)?"


def _json_regex(schema: dict) -> str:
    return regex_for_format({"type": "json_schema", "json_schema": {"schema": schema}})


def _unquoted(regex: str, where: str) -> str:
    """outlines-core's regex of a JSON string, without its quotes."""
    for opening, closing in (('("', '")'), ('"', '"')):
        if regex.startswith(opening) and regex.endswith(closing):
            return regex[len(opening):-len(closing)]
    raise GuidedFormatError(f"{where}: this string schema cannot be written in Gemma 4's notation")


class _Compiler:
    """A parameter's schema to the regex of its values in the notation; `$ref`s point into `root`."""

    def __init__(self, root: dict, where: str):
        self.root, self.where, self.refs_followed = root, where, 0

    def value(self, schema, depth: int = UNTYPED_DEPTH) -> str:
        if schema is True or schema == {}:
            return self.untyped(depth)
        if schema is False or not isinstance(schema, dict):
            raise GuidedFormatError(f"{self.where}: a schema must be an object or true")
        if "$ref" in schema:
            return self._reference(schema["$ref"], depth)
        if "const" in schema:
            return escape_literal(gemma4_literal(schema["const"]))
        if "enum" in schema:
            return one_of([escape_literal(gemma4_literal(v)) for v in schema["enum"]])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                return one_of([self.value({**rest, **sub} if isinstance(sub, dict) else sub, depth)
                               for sub in schema[key]])
        if "allOf" in schema:
            if len(schema["allOf"]) != 1:
                raise GuidedFormatError(f"{self.where}: allOf of more than one schema is not supported")
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            return self.value({**rest, **schema["allOf"][0]}, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            return one_of([self.value({**schema, "type": t}, depth) for t in kind])
        if kind is None:
            kind = next((k for k, keys in _IMPLIED_TYPES.items() if any(key in schema for key in keys)), None)
            if kind is None:
                return self.untyped(depth)
        if kind == "string":
            return self.string(schema)
        if kind in ("integer", "number"):
            return _json_regex({"type": kind})
        if kind == "boolean":
            return "(?:true|false)"
        if kind == "null":
            return "null"
        if kind == "array":
            return self.array(schema, depth)
        if kind == "object":
            return self.object(schema, depth)
        raise GuidedFormatError(f"{self.where}: unknown type {kind!r}")

    def _reference(self, ref: str, depth: int) -> str:
        match = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref)
        if not match or match[2] not in self.root.get(match[1], {}):
            raise GuidedFormatError(f"{self.where}: $ref {ref!r} does not point into the parameters' definitions")
        if self.refs_followed == MAX_REF_DEPTH:
            raise GuidedFormatError(f"{self.where}: $ref {ref!r} nests deeper than {MAX_REF_DEPTH} (a recursive "
                                    "schema), which Gemma 4's call grammar cannot write")
        self.refs_followed += 1
        try:
            return self.value(self.root[match[1]][match[2]], depth)
        finally:
            self.refs_followed -= 1

    def string(self, schema: dict) -> str:
        if "pattern" in schema or "format" in schema:
            keep = {k: schema[k] for k in ("pattern", "format") if k in schema}
            return _QUOTE + _unquoted(_json_regex({"type": "string", **keep}), self.where) + _QUOTE
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if low or high is not None:
            return _QUOTE + _BOUNDED_CHAR + "{" + f"{low},{'' if high is None else high}" + "}" + _QUOTE
        return _QUOTE + _TEXT + _QUOTE

    def array(self, schema: dict, depth: int) -> str:
        if "prefixItems" in schema:
            items = [self.value(s, depth) for s in schema["prefixItems"]]
            return r"\[" + ",".join(items) + r"\]"
        item = self.value(schema.get("items", True), depth - 1 if "items" not in schema else depth)
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if high == 0:
            return r"\[\]"
        more = "{" + f"{max(low - 1, 0)},{'' if high is None else high - 1}" + "}"
        items = f"{item}(?:,{item}){more}"
        return r"\[" + (items if low else f"(?:{items})?") + r"\]"

    def object(self, schema: dict, depth: int) -> str:
        return r"\{" + self.members(schema, depth, untyped_depth=depth - 1) + r"\}"

    def members(self, schema: dict, depth: int, untyped_depth: int) -> str:
        """An object's members, unbracketed: a call's arguments are the same within `call:NAME{...}`.
        Members it does not list are any values nested `untyped_depth` levels at most."""
        if lists_no_parameters(schema):
            extra = schema.get("additionalProperties", True)
            member = FREE_KEY + ":" + self.value(extra, untyped_depth if extra is True else depth)
            return _comma_list(member)
        required = set(schema.get("required", []))
        members = []
        for key in sorted(schema.get("properties") or {}, key=str.lower):
            if not re.fullmatch(BARE_KEY, key):
                raise GuidedFormatError(f"{self.where}: the name {key!r} cannot be a bare key in Gemma 4's "
                                        "tool calls (letters, digits, _ . - only); rename it")
            members.append((escape_literal(key) + ":" + self.value(schema["properties"][key], depth),
                            key in required))
        return in_order(members, ",")

    def untyped(self, depth: int) -> str:
        """Any value, nested at most `depth` levels."""
        scalars = [_QUOTE + _TEXT + _QUOTE, _json_regex({"type": "number"}), "true", "false", "null"]
        if depth <= 1:
            return one_of(scalars)
        inner = self.untyped(depth - 1)
        member = f"{FREE_KEY}:{inner}"
        return one_of(scalars + [r"\[" + _comma_list(inner) + r"\]", r"\{" + _comma_list(member) + r"\}"])


def _arguments_regex(function: FunctionDefinition) -> str:
    schema = object_parameters(function, "Gemma 4's arguments")
    # The call's braces are not a value's: its free arguments nest as deep as a listed one with no type.
    return _Compiler(schema, function.name).members(schema, UNTYPED_DEPTH, untyped_depth=UNTYPED_DEPTH)


def gemma4_call_regex(tools: list[ToolDefinition]) -> str:
    """One call of any of `tools`, `NAME{...}` (the syntax writes `<|tool_call>call:` before it);
    GuidedFormatError for a schema that cannot be written so."""
    return one_of([escape_literal(t.function.name) + r"\{" + _arguments_regex(t.function) + r"\}" for t in tools])


def render_call(name: str, arguments: dict | str) -> str:
    """A call as the template writes it; arguments that were not a JSON object go in as the client
    sent them (as the template does with a string)."""
    if isinstance(arguments, dict):
        arguments = gemma4_literal(arguments)[1:-1]
    return f"{name}{{{arguments}}}"
