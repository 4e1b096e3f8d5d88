"""Calls written as Python (deployments/pythonic_tool_calls.py) read as they stream, into OpenAI's
JSON arguments: `{"key": ` once a keyword's `=` is written, its value as it grows (`True`,
`False` and `None` as JSON's names once whole, the rest as written: the grammar writes values
as JSON does), `}` when the call's parenthesis closes. It is a CallReader
(deployments/call_notations.py), streamed by deployments/tool_call_stream.py.
"""

from __future__ import annotations

import json

from deployments.pythonic_tool_calls import PYTHON_NAMES
from deployments.written_call import CharacterReader, TranslatedCall

JSON_NAMES = {python: json.dumps(value) for value, python in PYTHON_NAMES.items()}


class PythonicCallReader(CharacterReader):
    """One choice's calls, from the syntax's prefix on (the list's `[`, OLMo 3's tag), read a
    character at a time: between calls, spacing and commas; what else cannot begin a name begins
    the suffix (`]`, OLMo 3's closing tag), after which nothing is read."""

    def __init__(self, prefix: str):
        super().__init__()
        self.state, self.word = "prefix" if prefix else "between", ""
        self.prefix_left = len(prefix)
        self.depth, self.in_string, self.escaped = 0, False, False

    def _char(self, c: str) -> None:
        if self.state == "suffix":
            return
        if self.state == "prefix":
            self.prefix_left -= 1
            self.state = "prefix" if self.prefix_left else "between"
        elif self.state == "between":
            if c.isalnum() or c in "_.-":  # a function's name (tool_protocol.FunctionDefinition)
                self.calls.append(TranslatedCall())
                self.state, self.word = "name", c
            elif c not in ", \n":
                self.state = "suffix"
        elif self.state == "name":
            if c == "(":
                self.calls[-1].name, self.state = self.word, "keywords"
            else:
                self.word += c
        elif self.state == "keywords":  # before a keyword, or the call's end
            if c == ")":
                self._end_call()
            elif c not in ", ":
                self.state, self.word = "keyword", c
        elif self.state == "keyword":
            if c == "=":
                call = self.calls[-1]
                call.json_arguments += ", " if call.json_arguments else "{"
                call.json_arguments += json.dumps(self.word, ensure_ascii=False) + ": "
                self.state, self.word, self.depth = "value", "", 0
            else:
                self.word += c
        else:
            self._value_char(c)

    def _value_char(self, c: str) -> None:
        call = self.calls[-1]
        if self.in_string:
            call.json_arguments += c
            self.in_string = self.escaped or c != '"'
            self.escaped = not self.escaped and c == "\\"
            return
        if c.isalpha():  # part of True, False, None or a number's exponent: held until it ends
            self.word += c
            return
        call.json_arguments += JSON_NAMES.get(self.word, self.word)
        self.word = ""
        if self.depth == 0 and c in ",)":
            if c == ")":
                self._end_call()
            else:
                self.state = "keywords"
            return
        call.json_arguments += c
        self.in_string = c == '"'
        self.depth += (c in "[{") - (c in "]}")

    def _end_call(self) -> None:
        call = self.calls[-1]
        call.json_arguments += "}" if call.json_arguments else "{}"
        self.state = "between"
