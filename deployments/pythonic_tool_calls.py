"""Tool calls written as a Python list of calls, as Llama 3.2, 3.3 and 4 write them under their
pythonic chat templates (vLLM's `pythonic` and `llama4_pythonic` parsers read the same):

    [get_weather(city="Oslo", days=3), get_time(zone=None)]

Each argument is a keyword whose value is a Python literal: a JSON value with `True`, `False`
and `None` for JSON's `true`, `false` and `null` (strings in double quotes, dicts with quoted
keys, as JSON writes them, which Python reads the same, but for JSON's escape `\\/`, which
Python does not have and the grammar leaves out). The calls are generated under
`pythonic_call_regex`: keywords in their schema's order, the required ones always, each value
under its schema's JSON regex with the three names swapped in. They are read back, into
OpenAI's JSON arguments, by deployments/pythonic_tool_call_reader.py.
"""

from __future__ import annotations

import json
import uuid

from app.guided.compiler import escape_literal, regex_for_format
from app.guided.errors import GuidedFormatError
from deployments.parameter_schema import lists_no_parameters, object_parameters, with_definitions
from deployments.text_regex import in_order, one_of
from deployments.tool_protocol import FunctionDefinition, ToolDefinition

PYTHON_NAMES = {True: "True", False: "False", None: "None"}
KEYWORD_SEPARATOR = ", "
FREE_KEYWORD = r"[A-Za-z_][A-Za-z0-9_]{0,63}"  # for a function whose schema lists no parameters
JSON_ESCAPE, PYTHON_ESCAPE = r'\\["\\/bfnrt]', r'\\["\\bfnrt]'  # in outlines-core's regex of a string
UNTYPED_DEPTH = 2  # how deep a value with no type may nest (as a json_object's members)

# JSON strings that stand for True, False and None in a schema until its regex is built; the
# random mark keeps a client's own strings from being taken for them.
_MARK = f"pythonic{uuid.uuid4().hex}"
_STAND_INS = {value: f"{_MARK}{name}" for value, name in PYTHON_NAMES.items()}
_STRUCTURE = ("anyOf", "oneOf", "allOf", "$ref", "properties", "items", "prefixItems", "pattern", "format",
              "minLength", "maxLength", "minItems", "maxItems", "additionalProperties", "required")


def python_literal(value) -> str:
    """A JSON value as a Python literal (how a call's arguments are written back)."""
    if isinstance(value, bool) or value is None:
        return PYTHON_NAMES[value]
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {python_literal(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def render_call(name: str, arguments: dict | str) -> str:
    """A call as the templates write it; arguments that were not a JSON object go in as the
    client sent them."""
    if isinstance(arguments, dict):
        arguments = KEYWORD_SEPARATOR.join(f"{k}={python_literal(v)}" for k, v in arguments.items())
    return f"{name}({arguments})"


def _stand_in(value):
    """A const or enum value with True, False and None as their stand-in strings."""
    if isinstance(value, bool) or value is None:
        return _STAND_INS[value]
    if isinstance(value, list):
        return [_stand_in(v) for v in value]
    if isinstance(value, dict):
        return {k: _stand_in(v) for k, v in value.items()}
    return value


def untyped_schema(depth: int = UNTYPED_DEPTH) -> dict:
    """Any value, nested at most `depth` levels (a regex cannot count brackets)."""
    scalars = [{"type": "string"}, {"type": "number"}, {"enum": [_STAND_INS[True], _STAND_INS[False]]},
               {"const": _STAND_INS[None]}]
    if depth <= 1:
        return {"anyOf": scalars}
    inner = untyped_schema(depth - 1)
    return {"anyOf": scalars + [{"type": "array", "items": inner},
                                {"type": "object", "additionalProperties": inner}]}


def python_schema(schema):
    """`schema` with booleans and null written as stand-in strings, and values it leaves untyped
    spelled out, so that its JSON regex holds them where Python's names go."""
    if schema is True:
        return untyped_schema()
    if not isinstance(schema, dict):
        return schema
    node = dict(schema)
    if "const" in node:
        node["const"] = _stand_in(node["const"])
    if "enum" in node and isinstance(node["enum"], list):
        node["enum"] = _stand_in(node["enum"])
    for key in ("properties", "$defs", "definitions"):
        if isinstance(node.get(key), dict):
            node[key] = {name: python_schema(sub) for name, sub in node[key].items()}
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = [python_schema(sub) for sub in node[key]]
    if "items" in node:
        node["items"] = ([python_schema(s) for s in node["items"]] if isinstance(node["items"], list)
                         else python_schema(node["items"]))
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = python_schema(node["additionalProperties"])
    kind = node.get("type")
    if kind == "array" and "items" not in node and "prefixItems" not in node:
        node["items"] = untyped_schema(UNTYPED_DEPTH - 1)
    if kind == "object" and "properties" not in node and node.get("additionalProperties", True) is True:
        node["additionalProperties"] = untyped_schema(UNTYPED_DEPTH - 1)  # else JSON's own names
    if isinstance(kind, list):
        rest = {k: v for k, v in node.items() if k != "type"}
        return {"anyOf": [python_schema({**rest, "type": t}) for t in kind]}
    if kind in ("boolean", "null") and ("const" in node or "enum" in node):  # its stand-ins, above
        return {k: v for k, v in node.items() if k != "type"}
    if kind == "boolean":
        return {"enum": [_STAND_INS[True], _STAND_INS[False]]}
    if kind == "null":
        return {"const": _STAND_INS[None]}
    if kind is None and not any(k in node for k in ("const", "enum", *_STRUCTURE)):
        return untyped_schema()
    return node


def python_value_regex(schema, root: dict, where: str) -> str:
    """The regex of a Python literal that `schema` (a parameter's, its `$ref`s into `root`)
    admits; GuidedFormatError for one that cannot compile."""
    try:
        regex = regex_for_format({"type": "json_schema", "json_schema": {
            "schema": python_schema(with_definitions(schema, root))}})
    except GuidedFormatError as exc:
        raise GuidedFormatError(f"{where}: {exc}") from None
    for value, stand_in in _STAND_INS.items():
        regex = regex.replace(json.dumps(stand_in), PYTHON_NAMES[value])
    return regex.replace(JSON_ESCAPE, PYTHON_ESCAPE)


def _arguments_regex(function: FunctionDefinition) -> str:
    schema, name = object_parameters(function, "keyword arguments"), function.name
    if lists_no_parameters(schema):
        free = FREE_KEYWORD + "=" + python_value_regex(True, schema, name)
        return f"(?:{free}(?:{escape_literal(KEYWORD_SEPARATOR)}{free})*)?"
    required = set(schema.get("required", []))
    keywords = []
    for key, sub in (schema.get("properties") or {}).items():
        if not key.isidentifier():
            raise GuidedFormatError(f"{name}: the parameter name {key!r} is not a Python identifier, so it "
                                    "cannot be a keyword argument in this model's tool calls; rename it")
        value = python_value_regex(sub, schema, f"{name}: parameter {key!r}")
        keywords.append((escape_literal(key) + "=" + value, key in required))
    return in_order(keywords, KEYWORD_SEPARATOR)


def pythonic_call_regex(tools: list[ToolDefinition]) -> str:
    """One call of any of `tools`; GuidedFormatError for a schema that cannot be written so."""
    calls = [escape_literal(t.function.name) + r"\(" + _arguments_regex(t.function) + r"\)" for t in tools]
    return one_of(calls)
