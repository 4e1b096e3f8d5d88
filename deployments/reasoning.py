"""A thinking model's reasoning, kept apart from its answer (vLLM's `--reasoning-parser`).

Such a model writes its reasoning, then `</think>` (or its parser's own closing tag, `TAGS`),
then the answer. With the app's
`reasoning_parser` set, a chat completion carries the reasoning in the message's (or delta's)
`reasoning` field and only the answer in `content`; tool calls are looked for in the answer.
The parsers:
- "deepseek_r1": every output starts in reasoning. The template may have opened `<think>`
  itself; one the model writes first is dropped. An output that ends before `</think>` is all
  reasoning (cut at max_tokens while thinking).
- "qwen3": the same, unless the request turns thinking off with `chat_template_kwargs`
  `{"enable_thinking": false}` (or `reasoning_effort: "none"`, which implies it, as in vLLM):
  then it is all answer.
- "minimax_m2" (MiniMax-M2) and "step3" (Step3): as "deepseek_r1" (all before `</think>`).
- "mimo" (MiMo): as "qwen3".
- "seed_oss" (Seed-OSS): as "qwen3", with its own tags, `<seed:think>` and `</seed:think>`.
- "deepseek_v3" (DeepSeek-V3.1 and later, hybrid models): all answer, unless the request turns
  thinking on with `chat_template_kwargs` `{"thinking": true}` (the templates' own switch) or
  `{"enable_thinking": true}` (as vLLM 0.32 reads either).
- "glm45", "glm47" (GLM-4.5 to 4.7), "kimi_k2" (Kimi K2 Thinking) and "holo2" (Holo2): thinking,
  unless the request sets `thinking` or `enable_thinking` and neither is true (vLLM 0.32's
  switch for them).
- "openai_gptoss" (gpt-oss): its reasoning is a harmony reply's analysis messages, read with the rest
  of the reply by deployments/harmony.py; an app whose replies are harmony has it unless it names another.
- "mistral" (Magistral, Ministral 3 Reasoning): reasoning only when the model opens it, `[THINK]` first
  and `[/THINK]` after; an output that does not begin with `[THINK]` is all answer (as vLLM reads them).
- "gemma4" (Gemma 4): as "mistral", in its thought channel, `<|channel>thought\n` first and `<channel|>`
  after. With `enable_thinking` off its template has written an empty channel into the prompt already.
- "cohere_command3" (Command R7B, Command A): as "gemma4", `<|START_THINKING|>` first and `<|END_THINKING|>`
  after (its plan before the calls; the template closes an empty one unless `enable_thinking` is on).
Newlines just after `</think>` are dropped: templates write them when a reply is fed back.
Usage counts as reasoning the output tokens up to the one that completed `</think>`.

An output format or tool-call grammar is for the answer, as in vLLM, which enforces structured
outputs once the reasoning ends: while thinking, the output is free text that has not yet closed
its reasoning (`thinking_then`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Callable, Sequence

from app.guided.compiler import escape_literal


def _thinking_unless_either_switch_is_off(kwargs: dict) -> bool:
    switches = [kwargs[name] for name in ("thinking", "enable_thinking") if kwargs.get(name) is not None]
    return not switches or any(map(bool, switches))


def _always_thinking(kwargs: dict) -> bool:
    return True


def _thinking_unless_switched_off(kwargs: dict) -> bool:
    return kwargs.get("enable_thinking") is not False  # the templates' `enable_thinking is false`


# Whether a request thinks, by parser, from its template variables, as the templates read them.
THINKING_SWITCHES = {
    "deepseek_r1": _always_thinking,
    "minimax_m2": _always_thinking,
    "step3": _always_thinking,
    "qwen3": _thinking_unless_switched_off,
    "mimo": _thinking_unless_switched_off,
    "seed_oss": _thinking_unless_switched_off,
    "deepseek_v3": lambda kwargs: bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking")),
    "glm45": _thinking_unless_either_switch_is_off,
    "glm47": _thinking_unless_either_switch_is_off,
    "kimi_k2": _thinking_unless_either_switch_is_off,
    "holo2": _thinking_unless_either_switch_is_off,
    "openai_gptoss": _always_thinking,
    "mistral": _always_thinking,  # may think: the model decides (ReasoningTags.optional)
    "gemma4": _always_thinking,  # as "mistral"
    "cohere_command3": _always_thinking,  # as "mistral"
}
REASONING_PARSERS = tuple(THINKING_SWITCHES)
RECENT_TOKENS = 16  # enough to spell `</think>` however the tokenizer splits it


@dataclass(frozen=True)
class ReasoningTags:
    """What opens a model's reasoning (it may be the template's, not written) and what ends it."""
    start: str = "<think>"
    end: str = "</think>"
    optional: bool = False  # the model writes `start` when it reasons; an output without it is all answer

    def __post_init__(self):
        for tag in (self.start, self.end):  # without_closing_tag: the first character, once
            if not tag or tag[0] not in "<[" or tag[0] in tag[1:]:
                raise ValueError(f"{tag!r}: a reasoning tag begins with '<' or '[', which does not recur in it")


THINK = ReasoningTags()
TAGS = {"seed_oss": ReasoningTags("<seed:think>", "</seed:think>"),
        "mistral": ReasoningTags("[THINK]", "[/THINK]", optional=True),
        "gemma4": ReasoningTags("<|channel>thought\n", "<channel|>", optional=True),
        "cohere_command3": ReasoningTags("<|START_THINKING|>", "<|END_THINKING|>", optional=True)}  # the others': THINK


def reasoning_tags(parser: str | None) -> ReasoningTags:
    return TAGS.get(parser, THINK)


def thinks(parser: str | None, template_variables: dict | None) -> bool:
    """Whether a chat request's output starts with reasoning."""
    return parser is not None and THINKING_SWITCHES[parser](template_variables or {})


@cache
def without_closing_tag(end: str = THINK.end) -> str:
    """A regex for any text in which the tag `end` does not occur. The tag's first character (its
    '<' or '[') is not in the rest of it, so once that is read the text either goes on spelling
    the tag, starts over with another, or leaves it (any other character) for free text again."""
    first = re.escape(end[0])
    partials = [re.escape(end[1:i]) for i in range(1, len(end))]  # "", "/", "/t", ..., "/think"
    spelled = "(?:" + "|".join(partials[1:]) + ")?"  # after the first character, so far
    left = "|".join(f"{p}[^{first}{re.escape(end[i + 1])}]" for i, p in enumerate(partials))
    after_first = f"(?:{spelled}{first})*"
    return f"(?:[^{first}]|{first}{after_first}(?:{left}))*(?:{first}{after_first}{spelled})?"


def thinking_then(answer_regex: str, tags: ReasoningTags = THINK) -> str:
    """The whole output's regex when the answer must fullmatch `answer_regex`: reasoning first,
    free but for its closing tag, which ends it (where the model opens its reasoning or not, any)."""
    start, end = escape_literal(tags.start), escape_literal(tags.end)
    if tags.optional:
        return f"(?:{start}{without_closing_tag(tags.end)}{end}\n{{0,2}})?(?:{answer_regex})"
    return f"(?:{start})?{without_closing_tag(tags.end)}{end}\n{{0,2}}(?:{answer_regex})"


class ReasoningStream:
    """One output split as it arrives: `feed` gives the (reasoning, answer) text that can go
    now; text that may be the start of a tag waits for the next piece."""

    def __init__(self, thinking: bool = True, decode: Callable[[list[int]], str] | None = None,
                 tags: ReasoningTags = THINK):
        """`decode` (the tokenizer's): to count exactly which of the tokens that came with the
        reasoning's end were written before it; without it they all count as reasoning."""
        self.tags = tags
        self.phase = "start" if thinking else "answer"
        self.held = ""
        self.reasoning_tokens = 0  # output tokens written before the reasoning ended, `</think>`'s included
        self.decode = decode
        self.recent_ids: list[int] = []  # the last tokens, to find the tag's end among new ones
        self.reasoned = False  # the output began with reasoning (an optional one was opened)
        self.undecided_tokens = 0  # tokens that may yet open an optional reasoning

    def feed(self, text: str) -> tuple[str, str]:
        self.held += text
        reasoning = answer = ""
        if self.phase == "start":
            if self.tags.start.startswith(self.held):
                return "", ""  # maybe the opening tag: wait
            opened = self.held.startswith(self.tags.start)
            self.held = self.held.removeprefix(self.tags.start)
            self.phase = "reasoning" if opened or not self.tags.optional else "answer"
            self.reasoned = self.phase == "reasoning"
        if self.phase == "reasoning":
            end = self.held.find(self.tags.end)
            if end < 0:
                keep = partial_suffix(self.held, self.tags.end)
                reasoning, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
                return reasoning, ""
            reasoning, self.held = self.held[:end], self.held[end + len(self.tags.end):]
            self.phase = "after_end"
        if self.phase == "after_end":
            self.held = self.held.lstrip("\n")
            if not self.held:
                return reasoning, ""
            self.phase = "answer"
        answer, self.held = self.held, ""
        return reasoning, answer

    @property
    def thinking(self) -> bool:
        """Still before the reasoning's end (or the start of an output that may open with it)."""
        return self.phase in ("start", "reasoning")

    def take(self, text: str, last: bool, token_ids: Sequence[int] = ()) -> tuple[str, str]:
        """`feed`, and when `text` is the output's last piece, `finish` too. `token_ids`: the
        tokens that wrote `text`, counted into `reasoning_tokens`."""
        was_thinking = self.thinking
        reasoning, answer = self.feed(text)
        if last:
            held_reasoning, held_answer = self.finish()
            reasoning, answer = reasoning + held_reasoning, answer + held_answer
        if was_thinking and self.phase == "start" and self.tags.optional:
            self.undecided_tokens += len(token_ids)  # reasoning's if it opens, else the answer's
        elif was_thinking and (self.thinking or self.reasoned):
            counted = len(token_ids) if self.thinking else self._written_by_the_tag_end(token_ids)
            self.reasoning_tokens += self.undecided_tokens + counted
            self.undecided_tokens = 0
        if was_thinking:
            self.recent_ids = (self.recent_ids + list(token_ids))[-RECENT_TOKENS:]
        return reasoning, answer

    def _written_by_the_tag_end(self, token_ids: Sequence[int]) -> int:
        """How many of `token_ids`, which ended the reasoning, it took to complete its closing tag."""
        for n in range(1, len(token_ids) + 1) if self.decode is not None else ():
            if self.tags.end in self.decode(self.recent_ids + list(token_ids[:n])):
                return n
        return len(token_ids)

    def finish(self) -> tuple[str, str]:
        """What is still held once the output ended: unfinished reasoning stays reasoning."""
        held, self.held = self.held, ""
        if self.phase == "start" and self.tags.optional:  # not opened: answer
            return "", held
        if self.phase in ("start", "reasoning"):
            return held, ""
        return "", held if self.phase == "answer" else ""


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_reasoning(text: str, thinking: bool = True, tags: ReasoningTags = THINK) -> tuple[str, str]:
    """A whole output as (reasoning, answer)."""
    return ReasoningStream(thinking, tags=tags).take(text, last=True)
