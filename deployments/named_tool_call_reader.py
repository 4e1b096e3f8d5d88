"""Calls whose name stands outside their JSON arguments (deployments/named_tool_calls.py) read as
they stream: the name once its end marker is written, the arguments as written, as they grow,
until their object closes. It is a CallReader (deployments/call_notations.py), streamed by
deployments/tool_call_stream.py.
"""

from __future__ import annotations

from deployments.named_tool_calls import NamedJsonCall
from deployments.written_call import WrittenCall, written_arguments


class NamedCallReader:
    """One choice's calls, from the first call's open on."""

    def __init__(self, form: NamedJsonCall):
        self.form, self.text, self.at, self.state = form, "", 0, "between"
        self.calls: list[WrittenCall] = []
        self.depth, self.in_string, self.escaped = 0, False, False

    def read(self, more: str) -> None:
        self.text += more
        while self._step():
            pass

    def arguments(self, call: WrittenCall, after: int = 0) -> str:
        return written_arguments(self.text, call, after)

    def _step(self) -> bool:
        """Read on while the text holds the next part (False: wait for more)."""
        form = self.form
        if self.state == "between":
            at = self.text.find(form.call_open, self.at)
            if at < 0:
                return False
            self.calls.append(WrittenCall())
            self.state, self.at = "name", at + len(form.call_open)
            return True
        call = self.calls[-1]
        if self.state == "name":
            end = self.text.find(form.name_end, self.at)
            if end < 0:
                return False
            call.name, call.id = form.read_name(self.text[self.at:end])
            self.state, self.at = "arguments", end + len(form.name_end)
            return True
        for i in range(self.at, len(self.text)):
            if self._closes_arguments(call, i, self.text[i]):
                self.state, self.at = "between", i + 1
                return True
        self.at = len(self.text)
        return False

    def _closes_arguments(self, call: WrittenCall, i: int, c: str) -> bool:
        if call.arguments_start is None:
            if c.isspace():
                return False
            call.arguments_start = i
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
            return False
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            if self.depth == 0:
                call.arguments_end = i + 1
                return True
        return False
