"""A tool call as its reader keeps it while it streams: `WrittenCall` for arguments that are a span
of the model's text, as the JSON calls' reader (deployments/json_tool_call_reader.py) and the named
calls' reader (deployments/named_tool_call_reader.py) read them, spacing included;
`TranslatedCall` for arguments the model writes otherwise (XML parameters, Python keywords),
which their readers turn into OpenAI's JSON as they grow."""

from __future__ import annotations

from dataclasses import dataclass

from deployments.tool_protocol import ToolCall


@dataclass(frozen=True)
class CallPiece:
    """More of call `index`: its first piece (`opens`) goes out with the call's id and name."""
    index: int
    arguments: str
    opens: bool = False


@dataclass
class WrittenCall:
    name: str | None = None
    id: str | None = None  # the model's own id for the call (Kimi's); else the stream makes one
    arguments_start: int | None = None
    arguments_end: int | None = None  # set once the arguments are known to have ended
    sent: int = 0  # characters of the arguments already given out
    call: ToolCall | None = None  # made when the name is known


@dataclass
class TranslatedCall:
    name: str | None = None
    json_arguments: str = ""  # OpenAI's arguments, as far as read
    sent: int = 0  # characters of them already given out
    call: ToolCall | None = None  # made when the name is known
    id: str | None = None  # the model's own id for the call (none of these syntaxes writes one)


class CharacterReader:
    """Calls read a character at a time into OpenAI's JSON arguments (Python keywords, Gemma 4's
    notation); `_char` is the notation's."""

    def __init__(self):
        self.text = ""
        self.calls: list[TranslatedCall] = []

    def read(self, more: str) -> None:
        self.text += more
        for c in more:
            self._char(c)

    def arguments(self, call: TranslatedCall, after: int = 0) -> str:
        return call.json_arguments[after:]

    def _char(self, c: str) -> None:
        raise NotImplementedError


def written_arguments(text: str, call: WrittenCall, after: int = 0) -> str:
    """The arguments written so far from character `after` on, less any trailing blank (which
    may still be spacing)."""
    if call.arguments_start is None:
        return ""
    end = call.arguments_end if call.arguments_end is not None else len(text)
    return text[call.arguments_start + after:end].rstrip()
