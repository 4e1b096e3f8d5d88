"""A grammar in GBNF, the EBNF that vLLM's `structured_outputs.grammar` takes (xgrammar's and llama.cpp's),
made into the regex its output must fullmatch:

    root   ::= select " FROM " table (" WHERE " cond)?
    select ::= "SELECT " ("*" | column ("," column){0,3})
    column ::= [a-z_] [a-z0-9_]*          # a comment
    ...

Rules are `name ::= alternatives`; an element is a string ("..."), a character class ([a-z], [^"\\]), any
character (.), a rule's name or a group ((...)), each may be followed by `*`, `+`, `?` or `{m}`, `{m,}`,
`{m,n}`. Output starts at `root`. The rules become one regex in grammar_rules.py, which refuses a
rule that refers to itself.
"""

from __future__ import annotations

import re

from app.guided.errors import GuidedFormatError
from app.guided.grammar_rules import class_char, rules_regex

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_RULE_START = re.compile(r"([A-Za-z_][A-Za-z0-9_.\-]*)\s*::=")
_BLANK = re.compile(r"(?:\s|#[^\n]*)*")
_RULE_LINE = re.compile(rf"^[ \t]*{_NAME.pattern}[ \t]*::=", re.MULTILINE)
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^",
            "/": "/", "'": "'"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


def is_gbnf(text: str) -> bool:
    """A grammar with a line that starts a rule (`name ::= ...`) is GBNF; one without is Lark's, as vLLM
    tells them apart."""
    return bool(_RULE_LINE.search(text))


def gbnf_regex(text: str) -> str:
    """The regex of `text`'s `root` rule; GuidedFormatError naming the problem otherwise."""
    rules = _Parser(text).rules()
    if "root" not in rules:
        raise GuidedFormatError("grammar: no `root` rule (the output is what `root` matches)")
    return rules_regex(rules, "root")


class _Parser:
    def __init__(self, text: str):
        self.text, self.at = text, 0

    def rules(self) -> dict[str, object]:
        rules: dict[str, object] = {}
        self._blank()
        while self.at < len(self.text):
            start = _RULE_START.match(self.text, self.at)
            if not start:
                self._fail("expected a rule, `name ::= ...`")
            name = start.group(1)
            if name in rules:
                self._fail(f"rule {name!r} is defined twice")
            self.at = start.end()
            rules[name] = self._alternatives()
            self._blank()
        return rules

    def _fail(self, message: str):
        line = self.text.count("\n", 0, self.at) + 1
        raise GuidedFormatError(f"grammar: {message} (line {line}, at {self.text[self.at:self.at + 20]!r})")

    def _blank(self) -> None:
        self.at = _BLANK.match(self.text, self.at).end()

    def _peek(self) -> str:
        return self.text[self.at:self.at + 1]

    def _alternatives(self) -> object:
        options = [self._sequence()]
        while self._peek() == "|":
            self.at += 1
            options.append(self._sequence())
        return ("alt", options) if len(options) > 1 else options[0]

    def _sequence(self) -> object:
        items = []
        while True:
            self._blank()
            c = self._peek()
            if not c or c in "|)" or _RULE_START.match(self.text, self.at):
                return ("seq", items)
            items.append(self._repeated(self._primary()))

    def _repeated(self, item: object) -> object:
        while True:
            self._blank()
            c = self._peek()
            if c in ("*", "+", "?"):
                self.at += 1
                item = ("repeat", item, c)
                continue
            bound = _REPEAT.match(self.text, self.at) if c == "{" else None
            if c == "{" and not bound:
                self._fail("a repetition is {m}, {m,} or {m,n}")
            if not bound:
                return item
            low, comma, high = bound.groups()
            if high and int(high) < int(low):
                self._fail(f"repetition {{{low},{high}}} has its bounds the wrong way round")
            self.at = bound.end()
            item = ("repeat", item, "{" + low + ("," + high if comma else "") + "}")

    def _primary(self) -> object:
        c = self._peek()
        if c == '"':
            return ("text", self._quoted())
        if c == "[":
            return ("class", self._char_class())
        if c == ".":
            self.at += 1
            return ("any",)
        if c == "(":
            self.at += 1
            inner = self._alternatives()
            self._blank()
            if self._peek() != ")":
                self._fail("a group is not closed with `)`")
            self.at += 1
            return inner
        name = _NAME.match(self.text, self.at)
        if not name:
            self._fail("expected a string, a character class, `.`, a rule's name or `(`")
        self.at = name.end()
        return ("ref", name.group())

    def _char(self, quote: str) -> str:
        """One character of a string or class, its escape read."""
        c = self._peek()
        if not c or c == "\n":
            self._fail(f"unterminated {quote}")
        self.at += 1
        if c != "\\":
            return c
        e = self._peek()
        self.at += 1
        if e in _HEX_DIGITS:
            digits = self.text[self.at:self.at + _HEX_DIGITS[e]]
            if not re.fullmatch(r"[0-9A-Fa-f]+", digits) or len(digits) != _HEX_DIGITS[e]:
                self._fail(f"\\{e} wants {_HEX_DIGITS[e]} hex digits")
            self.at += len(digits)
            return chr(int(digits, 16))
        if e not in _ESCAPES:
            self._fail(f"unknown escape \\{e}")
        return _ESCAPES[e]

    def _quoted(self) -> str:
        self.at += 1
        chars = []
        while self._peek() != '"':
            chars.append(self._char("string"))
        self.at += 1
        return "".join(chars)

    def _char_class(self) -> str:
        self.at += 1
        negated = self._peek() == "^"
        self.at += negated
        parts = []
        while self._peek() != "]":
            low = self._char("character class")
            if self._peek() == "-" and self.text[self.at + 1:self.at + 2] not in ("]", ""):
                self.at += 1
                high = self._char("character class")
                if ord(high) < ord(low):
                    self._fail(f"range {low!r}-{high!r} runs backwards")
                parts.append(class_char(low) + "-" + class_char(high))
            else:
                parts.append(class_char(low))
        self.at += 1
        if not parts:
            self._fail("an empty character class matches nothing")
        return "[" + "^" * negated + "".join(parts) + "]"
