"""Tool calls whose arguments are XML elements, one a parameter, as Qwen3-Coder and Qwen3.5 write
them (vLLM's `qwen3_coder` / `qwen3_xml` parsers read the same):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Oslo
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

GLM-4.5 / 4.6 (`glm45`), GLM-4.7 without the newlines (`glm47`):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Oslo</arg_value>
    </tool_call>

MiniMax-M2 (`minimax_m2`), several calls in one `<minimax:tool_call>` element:

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Oslo</parameter>
    </invoke>
    </minimax:tool_call>

Seed-OSS (`seed_oss`), Qwen3-Coder's elements in `<seed:tool_call>`, a value without newlines
around it:

    <seed:tool_call>
    <function=get_weather>
    <parameter=city>Oslo</parameter>
    </function>
    </seed:tool_call>

DeepSeek V3.2 (`deepseek_v32`), each parameter saying whether its value is text or JSON:

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

and Step 3 (`step3`), each call between marker tokens, as SGLang's step3 detector lays it out:

    <｜tool_calls_begin｜>
    <｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">
    <steptml:parameter name="city">Oslo</steptml:parameter>
    </steptml:invoke><｜tool_call_end｜>
    <｜tool_calls_end｜>

As their chat templates write values, a parameter whose schema is a string (`is_text_parameter`)
is its text, neither quoted nor escaped; one that is a string or null (`nullable_text`, as
Pydantic writes `Optional[str]`) is its text or `null`, which reads as null (as vLLM reads it);
any other is JSON. The first `value_end` ends a value, so a text value cannot hold it; a string
with `minLength`/`maxLength` cannot hold its first character (a newline in Qwen's, `<` in the
others'), which keeps a value that the grammar forces on from writing it. The calls are generated
under `xml_call_regex`, parameters in their schema's order, the required ones always; they are
read back by deployments/xml_tool_call_reader.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.guided.compiler import escape_literal, regex_for_format
from app.guided.errors import GuidedFormatError
from app.guided.regex_check import check_regex
from app.guided.string_formats import content_regex
from deployments.parameter_schema import lists_no_parameters, object_parameters, with_definitions
from deployments.text_regex import not_char, one_of, text_without
from deployments.tool_protocol import FunctionDefinition, ToolDefinition

FREE_PARAMETER_NAME = r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}"  # for a function whose schema lists none


@dataclass(frozen=True)
class XmlParameters:
    """The strings around a call's name and each of its parameters."""
    function_open: str
    name_end: str  # "": the name ends where the first parameter or the function's end begins
    parameter_open: str
    parameter_name_end: str
    value_end: str  # its first character must not recur in it (text_without)
    after_value: str
    function_end: str
    json_name_end: str = ""  # the name's end before a JSON value, where it is not the one before text

    def name_end_before(self, text: bool) -> str:
        return self.parameter_name_end if text or not self.json_name_end else self.json_name_end

    def render(self, name: str, arguments: dict | str) -> str:
        """A call as the chat templates write it (`| string` for strings, `| tojson` else);
        arguments that were not a JSON object go in as the client sent them."""
        if isinstance(arguments, dict):
            body = "".join(self.parameter_open + key + self.name_end_before(isinstance(value, str))
                           + _value_text(value) + self.value_end + self.after_value for key, value in arguments.items())
        else:
            body = arguments
        return self.function_open + name + self.name_end + body + self.function_end


QWEN3_PARAMETERS = XmlParameters("<function=", ">\n", "<parameter=", ">\n", "\n</parameter>", "\n",
                                 "</function>")
GLM45_PARAMETERS = XmlParameters("<tool_call>", "\n", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>", "\n",
                                 "</tool_call>")
GLM47_PARAMETERS = XmlParameters("<tool_call>", "", "<arg_key>", "</arg_key><arg_value>", "</arg_value>", "",
                                 "</tool_call>")
MINIMAX_M2_PARAMETERS = XmlParameters('<invoke name="', '">\n', '<parameter name="', '">', "</parameter>", "\n",
                                      "</invoke>")
SEED_OSS_PARAMETERS = XmlParameters("<function=", ">\n", "<parameter=", ">", "</parameter>", "\n", "</function>")
DEEPSEEK_V32_PARAMETERS = XmlParameters('<｜DSML｜invoke name="', '">\n', '<｜DSML｜parameter name="',
                                        '" string="true">', "</｜DSML｜parameter>", "\n", "</｜DSML｜invoke>",
                                        json_name_end='" string="false">')
STEP3_PARAMETERS = XmlParameters('<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="', '">\n',
                                 '<steptml:parameter name="', '">', "</steptml:parameter>", "\n",
                                 "</steptml:invoke><｜tool_call_end｜>")


def _value_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def is_text_parameter(schema) -> bool:
    """A parameter written as its bare text: a string, or an untyped enum or const of strings."""
    if not isinstance(schema, dict):
        return False
    if "type" in schema:
        return schema["type"] == "string"
    if "const" in schema:
        return isinstance(schema["const"], str)
    return "enum" in schema and all(isinstance(v, str) for v in schema["enum"])


def nullable_text(schema) -> dict | None:
    """The string schema of a parameter that is a string or null (`"type": ["string", "null"]`, or
    an `anyOf`/`oneOf` of a string schema and `{"type": "null"}`), else None."""
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if isinstance(kind, list) and sorted(kind) == ["null", "string"]:
        text = {**schema, "type": "string"}
        if isinstance(schema.get("enum"), list):
            text["enum"] = [v for v in schema["enum"] if v is not None]
        return text if isinstance(text.get("const", ""), str) else None
    for key in ("anyOf", "oneOf"):
        members = schema.get(key)
        if isinstance(members, list) and len(members) == 2 and {"type": "null"} in members:
            other = members[1 - members.index({"type": "null"})]
            if is_text_parameter(other):
                return other
    return None


def _text_regex(schema: dict, xml: XmlParameters, where: str) -> str:
    """A string parameter's text, as its schema's `const`, `enum`, `format`, `pattern` or
    lengths allow, never holding `value_end`."""
    if "const" in schema:
        return escape_literal(str(schema["const"]))
    if "enum" in schema:
        return "(?:" + "|".join(escape_literal(str(v)) for v in schema["enum"]) + ")"
    content = content_regex(schema, where)
    if content is not None:
        return f"(?:{check_regex(content)})"
    if "minLength" in schema or "maxLength" in schema:
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        return not_char(xml.value_end[0]) + f"{{{low},{'' if high is None else int(high)}}}"
    return text_without(xml.value_end)


def _value_regex(schema, root: dict, xml: XmlParameters, where: str) -> str:
    """A value, after the end of its parameter's name (which may say which kind of value it is)."""
    text_end, json_end = escape_literal(xml.name_end_before(True)), escape_literal(xml.name_end_before(False))
    if is_text_parameter(schema):
        return text_end + _text_regex(schema, xml, where)
    if (text := nullable_text(schema)) is not None:
        return f"(?:{json_end}null|{text_end}{_text_regex(text, xml, where)})" if xml.json_name_end else \
            f"{text_end}(?:null|{_text_regex(text, xml, where)})"
    schema = with_definitions(schema, root)
    return json_end + regex_for_format({"type": "json_schema", "json_schema": {"schema": schema}})


def _parameter(name: str, value: str, xml: XmlParameters) -> str:
    """One parameter element, from the regexes of its name and of its value with its name's end."""
    return escape_literal(xml.parameter_open) + name + value + escape_literal(xml.value_end + xml.after_value)


def _parameters_regex(function: FunctionDefinition, xml: XmlParameters) -> str:
    schema, name = object_parameters(function, "XML parameters"), function.name
    properties = schema.get("properties")
    if lists_no_parameters(schema):
        free_text = escape_literal(xml.name_end_before(True)) + text_without(xml.value_end)
        return f"(?:{_parameter(FREE_PARAMETER_NAME, free_text, xml)})*"
    required = set(schema.get("required", []))
    out = ""
    for key, sub in (properties or {}).items():
        if xml.parameter_name_end[0] in key:
            raise GuidedFormatError(f"{name}: the parameter name {key!r} holds {xml.parameter_name_end[0]!r}, "
                                    "which ends a name in this model's tool calls; rename it")
        where = f"#/properties/{key}"
        one = _parameter(escape_literal(key), _value_regex(sub, schema, xml, where), xml)
        out += one if key in required else f"(?:{one})?"
    return out


def xml_call_regex(tools: list[ToolDefinition], xml: XmlParameters) -> str:
    """One call of any of `tools`; GuidedFormatError for a schema that cannot be written so."""
    calls = [escape_literal(xml.function_open + t.function.name + xml.name_end)
             + _parameters_regex(t.function, xml) + escape_literal(xml.function_end) for t in tools]
    return one_of(calls)
