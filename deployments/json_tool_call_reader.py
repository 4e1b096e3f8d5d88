"""Calls written as JSON objects one after another (deployments/call_notations.py: JsonNotation) read
as they stream: the name once its string closes, the arguments as written, as they grow."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from deployments.written_call import WrittenCall, written_arguments


@dataclass
class JsonCallReader:
    """A character-level reader of JSON objects written one after another: it knows the depth,
    whether it is inside a string, and which key of the top object it is in (`name_is_key`: the
    first key is the call's name, and its value the arguments)."""
    arguments_key: str
    name_is_key: bool = False
    name_key: str = "name"
    text: str = ""
    depth: int = 0
    string_start: int | None = None
    escaped: bool = False
    expecting_key: bool = False
    key: str | None = None
    in_arguments: bool = False  # the key is the arguments' (set with the key, not looked up per character)
    calls: list[WrittenCall] = field(default_factory=list)

    def read(self, more: str) -> None:
        start = len(self.text)
        self.text += more
        for i in range(start, len(self.text)):
            self._char(i, self.text[i])

    def _char(self, i: int, c: str) -> None:
        if self.string_start is not None:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self._string_closed(i)
            return
        if self.depth == 0:  # between calls: syntax, until the next call opens
            if c == "{":
                self.depth, self.expecting_key, self.key, self.in_arguments = 1, True, None, False
                self.calls.append(WrittenCall())
            return
        call = self.calls[-1]
        at_value = self.depth == 1 and not self.expecting_key and self.in_arguments
        if at_value and call.arguments_start is None and not c.isspace() and c not in ",}":
            call.arguments_start = i
        if c == '"':
            self.string_start = i
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            if self.depth == 0:
                self._value_ended(call, i)
        elif self.depth == 1 and c == ":":
            self.expecting_key = False
        elif self.depth == 1 and c == ",":
            self._value_ended(call, i)
            self.expecting_key = True

    def _string_closed(self, i: int) -> None:
        if self.depth == 1:
            call = self.calls[-1]
            if self.expecting_key:
                self.key = json.loads(self.text[self.string_start:i + 1])
                if self.name_is_key and call.name is None:
                    call.name = self.key
                self.in_arguments = self.key == (call.name if self.name_is_key else self.arguments_key)
            elif not self.name_is_key and self.key == self.name_key and call.name is None:
                call.name = json.loads(self.text[self.string_start:i + 1])
        self.string_start = None

    def _value_ended(self, call: WrittenCall, i: int) -> None:
        if self.in_arguments and call.arguments_start is not None and call.arguments_end is None:
            call.arguments_end = call.arguments_start + len(self.text[call.arguments_start:i].rstrip())

    def arguments(self, call: WrittenCall, after: int = 0) -> str:
        return written_arguments(self.text, call, after)
