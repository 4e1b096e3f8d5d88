"""Calls in Gemma 4's notation (deployments/gemma4_tool_calls.py) read as they stream, into OpenAI's
JSON arguments: `{` when the call's own brace opens, each bare key quoted once its `:` is written,
a string's raw text escaped as it grows (a `<` held until it is known not to begin the closing
`<|"|>`), numbers, `true`, `false` and `null` as written (they are JSON's), `}` when the call's
brace closes. It is a CallReader (deployments/call_notations.py), streamed by
deployments/tool_call_stream.py.
"""

from __future__ import annotations

import json

from deployments.gemma4_tool_calls import QUOTE
from deployments.written_call import CharacterReader, TranslatedCall

CALL_OPEN = "call:"  # what begins each call after the syntax's marker


def _json_escaped(c: str) -> str:
    """A string's character as JSON writes it (non-ASCII as it is)."""
    return c if c >= " " and c not in '"\\' else json.dumps(c)[1:-1]


class Gemma4CallReader(CharacterReader):
    """One choice's calls, from the first `<|tool_call>` on, read a character at a time. Between
    calls the markers are skipped until `call:`; within a call, `stack` holds the open brackets
    (`{` objects whose next member starts with a bare key, `[` lists)."""

    def __init__(self):
        super().__init__()
        self.state, self.word = "between", ""
        self.stack: list[str] = []
        self.held = ""  # a string's text that may be the start of its closing QUOTE

    def _char(self, c: str) -> None:
        if self.state == "between":
            self.word += c
            if self.word.endswith(CALL_OPEN):
                self.calls.append(TranslatedCall())
                self.state, self.word = "name", ""
        elif self.state == "name":
            if c == "{":
                self.calls[-1].name, self.word = self.word, ""
                self._write("{")
                self.stack, self.state = ["{"], "key"
            else:
                self.word += c
        elif self.state == "key":
            self._key_char(c)
        elif self.state == "string":
            self._string_char(c)
        elif self.state == "quote":  # the opening QUOTE's rest
            self.word += c
            if self.word == QUOTE:
                self._write('"')
                self.state, self.word = "string", ""
        else:
            self._value_char(c)

    def _write(self, json_text: str) -> None:
        self.calls[-1].json_arguments += json_text

    def _key_char(self, c: str) -> None:
        if c == ":":
            self._write(json.dumps(self.word, ensure_ascii=False) + ": ")
            self.state, self.word = "value", ""
        elif c == "}" and not self.word:  # an object with no members
            self._close()
        else:
            self.word += c

    def _value_char(self, c: str) -> None:
        if c == "<":
            self.state, self.word = "quote", c
        elif c == "{":
            self._write("{")
            self.stack.append("{")
            self.state = "key"
        elif c == "[":
            self._write("[")
            self.stack.append("[")
        elif c in "}]":
            self._close()
        elif c == ",":
            self._write(", ")
            self.state = "key" if self.stack[-1] == "{" else "value"
        else:  # a number, `true`, `false` or `null`, as JSON writes it
            self._write(c)

    def _close(self) -> None:
        bracket = self.stack.pop()
        self._write("}" if bracket == "{" else "]")
        self.state = "value" if self.stack else "between"

    def _string_char(self, c: str) -> None:
        if not self.held and c != "<":  # most of a string's characters
            self._write(_json_escaped(c))
            return
        self.held += c
        if self.held == QUOTE:
            self._write('"')
            self.state, self.held = "value", ""
            return
        while self.held and not QUOTE.startswith(self.held):
            self._write(_json_escaped(self.held[0]))
            self.held = self.held[1:]
