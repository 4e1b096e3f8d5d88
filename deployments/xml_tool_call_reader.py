"""Calls written as XML parameters (deployments/xml_tool_calls.py) read as they stream, into
OpenAI's JSON arguments: `{"key": ` once a parameter's name ends, its value as it grows (a text
value JSON-escaped inside quotes, any other as written), `}` when the function ends. What may
still be the start of a value's end is held, and so is a nullable text value while it may still
be `null`. It is a CallReader (deployments/call_notations.py), streamed by
deployments/tool_call_stream.py.
"""

from __future__ import annotations

import json

from deployments.reasoning import partial_suffix
from deployments.tool_protocol import ToolDefinition
from deployments.written_call import TranslatedCall
from deployments.xml_tool_calls import XmlParameters, is_text_parameter, nullable_text


class XmlCallReader:
    """One choice's calls, from the first call's open on; a value's type is what its name's end says
    (DeepSeek V3.2's `string="true"`), else its parameter's in the request's tools (text where they
    do not say, as vLLM reads it)."""

    def __init__(self, xml: XmlParameters, tools: list[ToolDefinition] | None):
        self.xml, self.text, self.at, self.state = xml, "", 0, "between"
        self.calls: list[TranslatedCall] = []
        self.properties = {t.function.name: t.function.schema_.get("properties") or {} for t in tools or []}
        self.value_kind = "json"  # "text", "json" or "nullable" (text or null)
        self.held = ""  # a nullable value's text while it may still be `null`

    def read(self, more: str) -> None:
        self.text += more
        while self._step():
            pass

    def arguments(self, call: TranslatedCall, after: int = 0) -> str:
        return call.json_arguments[after:]

    def _step(self) -> bool:
        """Read the next element if the text holds it (False: wait for more)."""
        xml, call = self.xml, self.calls[-1] if self.calls else None
        if self.state == "between":
            at = self.text.find(xml.function_open, self.at)
            if at < 0:
                return False
            self.calls.append(TranslatedCall())
            return self._to("name", at + len(xml.function_open))
        if self.state == "name":  # a function's name cannot hold "<" (tool_protocol.FunctionDefinition)
            end = self.text.find(xml.name_end or "<", self.at)
            if end < 0:
                return False
            call.name = self.text[self.at:end]
            return self._to("parameters", end + len(xml.name_end))
        if self.state == "parameters":
            found = [(at, tag) for tag in (xml.parameter_open, xml.function_end)
                     if (at := self.text.find(tag, self.at)) >= 0]
            if not found:
                return False
            at, tag = min(found)
            if tag == xml.function_end:
                call.json_arguments += "}" if call.json_arguments else "{}"
                return self._to("between", at + len(tag))
            return self._to("parameter name", at + len(tag))
        if self.state == "parameter name":
            found = [(at, tag) for tag in (xml.parameter_name_end, xml.json_name_end)
                     if tag and (at := self.text.find(tag, self.at)) >= 0]
            if not found:
                return False
            end, tag = min(found)
            key = self.text[self.at:end]
            schema = self.properties.get(call.name, {}).get(key)
            if xml.json_name_end:  # the name's end says
                self.value_kind = "json" if tag == xml.json_name_end else "text"
            else:
                self.value_kind = ("text" if schema is None or is_text_parameter(schema)
                                   else "nullable" if nullable_text(schema) is not None else "json")
            call.json_arguments += (", " if call.json_arguments else "{") + json.dumps(key, ensure_ascii=False) \
                + ": " + ('"' if self.value_kind == "text" else "")
            return self._to("value", end + len(tag))
        end = self.text.find(xml.value_end, self.at)  # in a value
        known = end if end >= 0 else len(self.text) - partial_suffix(self.text[self.at:], xml.value_end)
        value = self.text[self.at:known]
        if self.value_kind == "nullable":
            value, self.held = self.held + value, ""
            if end >= 0 and value == "null":
                self.value_kind = "json"
            elif end < 0 and "null".startswith(value):
                value, self.held = "", value
            else:
                call.json_arguments += '"'
                self.value_kind = "text"
        call.json_arguments += json.dumps(value, ensure_ascii=False)[1:-1] if self.value_kind == "text" else value
        if end < 0:
            self.at = known
            return False
        call.json_arguments += '"' if self.value_kind == "text" else ""
        return self._to("parameters", end + len(xml.value_end))

    def _to(self, state: str, at: int) -> bool:
        self.state, self.at = state, at
        return True
