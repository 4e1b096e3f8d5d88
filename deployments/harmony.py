"""gpt-oss's replies, in OpenAI's harmony format: a reply is messages, each a header and a body, and
the header says where the body goes.

    <|channel|>analysis<|message|>The user asks for the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>

The template ends the prompt with `<|start|>assistant`, so the reply's first header has no role.
`<|end|>` ends a message; `<|call|>` and `<|return|>` end the reply (they are EOS tokens in
generation_config.json, so they are not in its text). A recipient may stand with the role
(`assistant to=functions.f<|channel|>commentary json`) or after the channel. As vLLM reads a body
(its harmony stream reader, vllm/entrypoints/openai/chat_completion/stream_harmony.py):
- to `functions.NAME` (on any channel): a call of NAME, its arguments the body as written;
- to another recipient (gpt-oss's built-in browser and python tools, which this server does not run):
  reasoning on the analysis channel, else left out;
- on the analysis channel: reasoning; on the final channel, or a preamble on commentary: content.
Bodies of the same kind are joined by a newline. A reply with no message at all (a model that does
not write harmony) is all content. The app reads replies so when its tool-call convention is
"openai" (its `tool_call_parser`, or a template that writes `<|channel|>`); its reasoning is shown
with the reasoning parser "openai_gptoss", which such an app has unless it names another.

Guided answers (deployments/guided_formats.py, deployments/tool_calls.py) follow the reply's own
shape: an analysis message, free but for `<|`, may come first; then a final message holding the
format, or one call's message holding its arguments. The call is the reply's last message (`<|call|>`
ends the reply), so `required` makes one call and never more.
"""

from __future__ import annotations

from typing import Any, Sequence

from app.guided.compiler import escape_literal
from deployments.reasoning import partial_suffix
from deployments.text_regex import one_of, text_without
from deployments.tool_protocol import FunctionCall, ToolCall
from deployments.written_call import CallPiece, TranslatedCall

START, CHANNEL, MESSAGE, CONSTRAIN, END = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>"
REPLY_ENDS = ("<|call|>", "<|return|>")  # EOS: in the text only with `include_stop_str_in_output`
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END)  # what the reader must see as text (deployments/markup_tokens.py)
FUNCTIONS = "functions."


def reply_end_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids of `<|call|>` and `<|return|>` in `tokenizer`: a harmony reply stops at either, named
    EOS in generation_config.json or not (gpt-oss's first checkpoints left `<|call|>` out), as vLLM
    stops harmony replies."""
    vocabulary = tokenizer.get_vocab()
    return tuple(vocabulary[t] for t in REPLY_ENDS if t in vocabulary)


def call_header(name: str) -> str:
    """The header of a call's message, as gpt-oss writes it."""
    return f"{CHANNEL}commentary to={FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}"


FINAL_HEADER = f"{CHANNEL}final{MESSAGE}"
ANALYSIS = (f"(?:{escape_literal(CHANNEL + 'analysis' + MESSAGE)}{text_without('<|')}"
            f"{escape_literal(END + START)}assistant)?")


def guided_reply(answer_regex: str, header: str = FINAL_HEADER) -> str:
    """The reply's regex when its answer must fullmatch `answer_regex`: any analysis, then the answer's
    message (`header`: "" when `answer_regex` holds its own headers, as the calls' regex does)."""
    return f"{ANALYSIS}{escape_literal(header)}(?:{answer_regex})"


def calls_regex(names_and_arguments: list[tuple[str, str]]) -> str:
    """One call of any of the tools: (name, arguments regex) each."""
    return one_of([escape_literal(call_header(name)) + f"(?:{arguments})" for name, arguments in names_and_arguments])


def _where(header: str) -> tuple[str | None, str | None]:
    """(where a body goes: "reasoning", "content", "call" or None, the call's name) by its header."""
    role, _, after = header.partition(CHANNEL)
    after_channel = after.replace(CONSTRAIN, " ").split()
    channel = after_channel[0] if after_channel else ""
    recipient = next((w.removeprefix("to=") for w in role.split() + after_channel if w.startswith("to=")), None)
    if recipient is not None and recipient.startswith(FUNCTIONS):
        return "call", recipient.removeprefix(FUNCTIONS)
    if channel == "analysis":
        return "reasoning", None
    if recipient is None and channel in ("final", "commentary"):
        return "content", None
    return None, None


class HarmonyReply:
    """One reply read as it streams: `take` gives the (reasoning, content) text that can go now and
    keeps the calls' new pieces for `pieces`; text that may be the start of a marker waits."""

    def __init__(self):
        self.state = "header"  # then "body", then "between" messages
        self.held = ""  # the header so far, or the body's end that may begin a marker
        self.where: str | None = None  # the body's
        self.messages = 0
        self.kinds_written: set[str] = set()  # "reasoning", "content": a newline before the next body of the kind
        self.calls: list[TranslatedCall] = []
        self.new_pieces: list[CallPiece] = []
        self.reasoning_tokens = 0  # output tokens of messages whose bodies went to reasoning, headers included
        self.header_tokens = 0  # those of the header being read: counted once its body's place is known
        self.everything = ""  # the text until the first message, all of a reply that holds none
        self.newline_before = False  # the body being read follows one of its kind

    def take(self, text: str, last: bool, token_ids: Sequence[int] = ()) -> tuple[str, str]:
        """More of the reply (`last`: the end of it); `token_ids`: the tokens that wrote `text`."""
        in_body = self.state == "body"
        if in_body:
            self.reasoning_tokens += len(token_ids) if self.where == "reasoning" else 0
        else:
            self.header_tokens += len(token_ids)
        if self.messages == 0:
            self.everything += text
        out = {"reasoning": "", "content": ""}
        self._read(self.held + text, out)
        if last:
            self._finish(out)
        return out["reasoning"], out["content"]

    def _read(self, text: str, out: dict) -> None:
        self.held = ""
        while text:
            if self.state == "between":
                at = text.find(START)
                if at < 0:
                    self.held = text[len(text) - partial_suffix(text, START):]
                    return
                text, self.state = text[at + len(START):], "header"
            elif self.state == "header":
                at = text.find(MESSAGE)
                if at < 0:
                    self.held = text
                    return
                self._open(text[:at])
                text = text[at + len(MESSAGE):]
            else:
                found = [(text.find(m), m) for m in (END, *REPLY_ENDS) if m in text]
                if not found:
                    keep = max(partial_suffix(text, m) for m in (END, *REPLY_ENDS))
                    self._body(text[:len(text) - keep], out)
                    self.held = text[len(text) - keep:]
                    return
                at, marker = min(found)
                self._body(text[:at], out)
                text, self.state = text[at + len(marker):], "between"

    def _open(self, header: str) -> None:
        self.where, name = _where(header)
        self.messages += 1
        self.reasoning_tokens += self.header_tokens if self.where == "reasoning" else 0
        self.header_tokens = 0
        self.state = "body"
        if self.where == "call":
            call = TranslatedCall(name=name)
            call.call = ToolCall(function=FunctionCall(name=name, arguments=""))
            self.calls.append(call)
            self.new_pieces.append(CallPiece(len(self.calls) - 1, "", opens=True))
        self.newline_before = self.where in self.kinds_written

    def _body(self, text: str, out: dict) -> None:
        if not text or self.where is None:
            return
        if self.where == "call":
            call = self.calls[-1]
            call.json_arguments += text
            self.new_pieces.append(CallPiece(len(self.calls) - 1, text))
            return
        if self.newline_before:
            text, self.newline_before = "\n" + text, False
        out[self.where] += text
        self.kinds_written.add(self.where)

    def _finish(self, out: dict) -> None:
        """The reply ended: a body's held end is its text; a reply with no message is all content."""
        held, self.held = self.held, ""
        if self.messages == 0:
            out["content"] += self.everything
        elif self.state == "body":
            self._body(held, out)

    def pieces(self) -> list[CallPiece]:
        """The calls' pieces since the last time, each call's first with its name."""
        new, self.new_pieces = self.new_pieces, []
        return new

    def whole_calls(self) -> list[ToolCall] | None:
        made = [c.call.model_copy(update={"function": FunctionCall(name=c.name, arguments=c.json_arguments)})
                for c in self.calls]
        return made or None
