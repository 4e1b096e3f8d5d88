"""Tool calls read as they are written: a stream sends each call's name as soon as its string
closes and its arguments as they grow (as OpenAI's and vLLM's streams do), and a whole output
parses to exactly what its stream sent, because it is read by the same stream.

Each call is read by its syntax's notation's reader (deployments/call_notations.py); text between
calls at the top level is the syntax's prefix, separators and suffix. A harmony reply's calls are
messages of their own, read with the rest of the reply by deployments/harmony.py. Where the syntax
opens calls with a tag (`<tool_call>`), text may come first: the answer's content, up to the tag. A
call's arguments are its arguments value as the model wrote it, spacing included. An output cut while
writing a call (`max_tokens`) still reports the calls whose names were complete, with the
arguments written so far, as OpenAI does with `finish_reason: "length"`.
"""

from __future__ import annotations

from deployments.harmony import HarmonyReply
from deployments.reasoning import partial_suffix
from deployments.tool_calls import ToolCallSyntax
from deployments.tool_protocol import FunctionCall, ToolCall, ToolDefinition
from deployments.written_call import CallPiece


class ToolStream:
    """One choice's answer as it streams: its text, then its calls in pieces (the grammar makes
    an answer text, calls, or, where calls open with a tag, text and then calls). Text passes
    through as soon as it is known not to open a call; what may still open one is held."""

    def __init__(self, syntax: ToolCallSyntax, tools: list[ToolDefinition] | None = None):
        """`tools`: the request's, which say how a call written as XML parameters types its values."""
        self.syntax, self.held, self.in_calls, self.text_only = syntax, "", False, False
        self.reader = syntax.notation.reader(syntax.prefix, tools)
        self.ids: set[str] = set()  # the calls' ids so far: a client matches each result to one

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
        self.reader.read(text)
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
        for index, call in enumerate(self.reader.calls):
            if call.name is None:
                continue
            opens = call.call is None
            if opens:  # the model's own id (Kimi's, Mistral's) unless an earlier call of the answer has it
                made = FunctionCall(name=call.name, arguments="")
                own_id = call.id and call.id not in self.ids
                call.call = ToolCall(id=call.id, function=made) if own_id else ToolCall(function=made)
                self.ids.add(call.call.id)
            more = self.reader.arguments(call, after=call.sent)  # what was sent ends in no blank
            if opens or more:
                pieces.append(CallPiece(index, more, opens))
                call.sent += len(more)
        return pieces

    def finish(self) -> tuple[str, list[ToolCall] | None]:
        """(text still held, the calls) once the output has ended: the calls whose names were
        written, or None, when the held text (and what began like a call) is the rest of the answer."""
        calls = [c.call.model_copy(update={"function": FunctionCall(
            name=c.name, arguments=self.reader.arguments(c))}) for c in self.reader.calls if c.call]
        return ("", calls) if calls else (self.held + self.reader.text, None)

    def call(self, index: int) -> ToolCall:
        """Call `index` as opened: its id and name."""
        return self.reader.calls[index].call


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
