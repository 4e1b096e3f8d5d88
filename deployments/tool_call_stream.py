"""Tool calls read as they are written: a stream sends each call's name as soon as its string
closes and its arguments as they grow (as OpenAI's and vLLM's streams do), and a whole output
parses to exactly what its stream sent, because it is read by the same stream.

Calls are JSON objects written under the call grammar (deployments/tool_calls.py), or XML
parameters, read by deployments/xml_tool_call_reader.py, or JSON arguments after a name
between markers, read by deployments/named_tool_call_reader.py, or Python calls, read by
deployments/pythonic_tool_call_reader.py, or Gemma 4's notation, read by
deployments/gemma4_tool_call_reader.py; text between them at the top level is
the syntax's prefix, separators and suffix. A harmony reply's calls are messages of their own, read
with the rest of the reply by deployments/harmony.py. Where the syntax opens calls
with a tag (`<tool_call>`), text may come first: the answer's content, up to the tag. A call's
arguments are its arguments value as the model wrote it, spacing included. An output cut while
writing a call (`max_tokens`) still reports the calls whose names were complete, with the
arguments written so far, as OpenAI does with `finish_reason: "length"`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from deployments.gemma4_tool_call_reader import Gemma4CallReader
from deployments.harmony import HarmonyReply
from deployments.reasoning import partial_suffix
from deployments.named_tool_call_reader import NamedCallReader
from deployments.pythonic_tool_call_reader import PythonicCallReader
from deployments.tool_calls import ToolCallSyntax
from deployments.tool_protocol import FunctionCall, ToolCall, ToolDefinition
from deployments.written_call import CallPiece, WrittenCall, written_arguments
from deployments.xml_tool_call_reader import XmlCallReader


@dataclass
class _Scanner:
    """A character-level reader of JSON objects written one after another: it knows the depth,
    whether it is inside a string, and which key of the top object it is in (`name_is_key`: the
    first key is the call's name, and its value the arguments)."""
    arguments_key: str
    name_is_key: bool = False
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
            elif not self.name_is_key and self.key == "name" and call.name is None:
                call.name = json.loads(self.text[self.string_start:i + 1])
        self.string_start = None

    def _value_ended(self, call: WrittenCall, i: int) -> None:
        if self.in_arguments and call.arguments_start is not None and call.arguments_end is None:
            call.arguments_end = call.arguments_start + len(self.text[call.arguments_start:i].rstrip())

    def arguments(self, call: WrittenCall, after: int = 0) -> str:
        return written_arguments(self.text, call, after)


class ToolStream:
    """One choice's answer as it streams: its text, then its calls in pieces (the grammar makes
    an answer text, calls, or, where calls open with a tag, text and then calls). Text passes
    through as soon as it is known not to open a call; what may still open one is held."""

    def __init__(self, syntax: ToolCallSyntax, tools: list[ToolDefinition] | None = None):
        """`tools`: the request's, which say how a call written as XML parameters types its values."""
        self.syntax, self.held, self.in_calls, self.text_only = syntax, "", False, False
        self.scanner = (XmlCallReader(syntax.xml, tools) if syntax.xml
                        else NamedCallReader(syntax.named) if syntax.named
                        else PythonicCallReader(syntax.prefix) if syntax.pythonic
                        else Gemma4CallReader() if syntax.gemma4
                        else _Scanner(syntax.arguments_key, syntax.name_is_key))

    def feed(self, text: str) -> tuple[str, list[CallPiece]]:
        """(text to stream as content now, the calls' new pieces)."""
        if self.text_only:
            return text, []
        content = ""
        if not self.in_calls:
            self.held += text
            content, text = self._text_before_calls()
            if not self.in_calls:
                return content, []
        self.scanner.read(text)
        return content, self._pieces()

    def _text_before_calls(self) -> tuple[str, str]:
        """(the held text that is content, the held text that begins the calls), holding back what
        may still open a call: the longest end of the text that begins the syntax's tag, or, where
        calls can only be the whole answer, all of it until it begins like a call or cannot."""
        held, tag = self.held, self.syntax.tag
        if tag and tag in held:
            at = held.index(tag)
            self.in_calls, self.held = True, ""
            return held[:at], held[at:]
        if tag:
            keep = partial_suffix(held, tag)
            self.held = held[len(held) - keep:]
            return held[:len(held) - keep], ""
        if held.startswith(self.syntax.start):
            self.in_calls, self.held = True, ""
            return "", held
        if self.syntax.start.startswith(held):
            return "", ""
        self.text_only, self.held = True, ""
        return held, ""

    def _pieces(self) -> list[CallPiece]:
        pieces = []
        for index, call in enumerate(self.scanner.calls):
            if call.name is None:
                continue
            opens = call.call is None
            if opens:
                made = FunctionCall(name=call.name, arguments="")
                call.call = ToolCall(id=call.id, function=made) if call.id else ToolCall(function=made)
            more = self.scanner.arguments(call, after=call.sent)  # what was sent ends in no blank
            if opens or more:
                pieces.append(CallPiece(index, more, opens))
                call.sent += len(more)
        return pieces

    def finish(self) -> tuple[str, list[ToolCall] | None]:
        """(text still held, the calls) once the output has ended: the calls whose names were
        written, or None, when the held text (and what began like a call) is the rest of the answer."""
        calls = [c.call.model_copy(update={"function": FunctionCall(
            name=c.name, arguments=self.scanner.arguments(c))}) for c in self.scanner.calls if c.call]
        return ("", calls) if calls else (self.held + self.scanner.text, None)

    def call(self, index: int) -> ToolCall:
        """Call `index` as opened: its id and name."""
        return self.scanner.calls[index].call


class HarmonyCallStream:
    """The calls of a harmony reply (deployments/harmony.py), with a ToolStream's face. `reply`: the
    route's, which has taken the reply apart already, so what it is fed (its content) passes through;
    without one, it reads the whole reply itself and gives its content (its reasoning left out)."""

    def __init__(self, reply: HarmonyReply | None = None):
        self.reads_the_reply = reply is None
        self.reply = reply or HarmonyReply()

    def feed(self, text: str) -> tuple[str, list[CallPiece]]:
        content = self.reply.take(text, last=False)[1] if self.reads_the_reply else text
        return content, self.reply.pieces()

    def finish(self) -> tuple[str, list[ToolCall] | None]:
        held = self.reply.take("", last=True)[1] if self.reads_the_reply else ""
        return held, self.reply.whole_calls()

    def call(self, index: int) -> ToolCall:
        return self.reply.calls[index].call


def call_stream(syntax: ToolCallSyntax, tools: list[ToolDefinition] | None = None,
                reply: HarmonyReply | None = None) -> ToolStream | HarmonyCallStream:
    """The reader of an answer's calls in `syntax` (`reply`: a harmony reply's reader, whose calls they are)."""
    return HarmonyCallStream(reply) if syntax.harmony else ToolStream(syntax, tools)


def parse_calls(text: str, syntax: ToolCallSyntax,
                tools: list[ToolDefinition] | None = None) -> tuple[str, list[ToolCall] | None]:
    """(the text before the calls, the calls) of a whole output written in `syntax`, or (the
    output, None) if it holds no call: what its stream would have sent."""
    stream = call_stream(syntax, tools)
    content, _ = stream.feed(text)
    held, calls = stream.finish()
    return content + held, calls
