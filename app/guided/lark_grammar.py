"""A grammar in Lark's syntax (OpenAI's custom tools' `syntax: "lark"`; vLLM takes it in
`structured_outputs.grammar` too), made into the regex its output must fullmatch:

    start: "SELECT " columns " FROM " NAME
    columns: "*" | NAME ("," NAME)~0..3
    NAME: /[a-z_][a-z0-9_]*/
    %import common.WS
    %ignore WS

Rules (lowercase) and terminals (UPPERCASE) are `name: alternatives`, alternatives may go on over lines
that start with `|`. Items: strings ("..." or '...', `i` after one for any case), patterns (/regex/ with
flags i, m, s, x), ranges ("a".."z"), names, groups ( ), optional [ ], and `? * + ~n ~n..m` after an
item. `%import common.NAME` (or `common (A, B)`, `common.NAME -> OTHER`) takes Lark's common terminals;
`%ignore` names what may come before each terminal of a rule and at the end. Output starts at `start`
(or, as vLLM reads it, the first definition where there is no `start`). Aliases (`-> name`), rule
modifiers (`?`, `!`) and priorities (`.2`) shape Lark's tree, not its language, and are read past.
A terminal's pattern is taken as the texts it matches; which split a longest-match lexer would choose
is not modelled. Templates, `%declare`, `%override` and `%extend` are refused, as are rules that refer
to themselves (grammar_rules.py).
"""

from __future__ import annotations

import re
from functools import cache

from app.guided.errors import GuidedFormatError
from app.guided.grammar_rules import class_char, rules_regex, text_regex

_TOKEN = re.compile(r"""
    (?P<skip>[ \t]+|(?://|\#)[^\n]*|\\[ ]*\r?\n)
  | (?P<nl>(?:\r?\n)+)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?|'(?:\\.|[^'\\\n])*'i?)
  | (?P<regexp>/(?!/)(?:\\.|[^/\\\n])+/[imslux]*)
  | (?P<to>->)
  | (?P<dotdot>\.\.)
  | (?P<number>[+-]?\d+)
  | (?P<directive>%[a-z]+)
  | (?P<name>_?[A-Za-z][_A-Za-z0-9]*)
  | (?P<punct>[:|()\[\]{},.~+*?!])
""", re.VERBOSE)
_STRING_ESCAPES = {"n": "\n", "f": "\f", "t": "\t", "r": "\r", "\\": "\\", '"': '"'}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_REGEX_FLAGS = set("imsxu")  # Lark's but l (locale); u: Python 3's str patterns are Unicode already
_IGNORED = "%ignore"  # the terminal `%ignore` defines; no name in a grammar can clash with it
# Lark's grammars/common.lark, where its patterns use a lookbehind or a lazy match written out as the
# texts Lark's lexer takes (ESCAPED_STRING, C_COMMENT)
COMMON = r'''
DIGIT: "0".."9"
HEXDIGIT: "a".."f"|"A".."F"|DIGIT
INT: DIGIT+
SIGNED_INT: ["+"|"-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e"|"E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+"|"-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+"|"-"] NUMBER
ESCAPED_STRING: "\"" /([^"\\\n]|\\.)*/ "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_"|LETTER) ("_"|LETTER|DIGIT)*
WS_INLINE: (" "|/\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" /([^*]|\*+[^*\/])*\*+/ "/"
SQL_COMMENT: /--[^\n]*/
'''


def lark_regex(text: str) -> str:
    """The regex of the grammar's start rule; GuidedFormatError naming the problem otherwise."""
    grammar = _Parser(text).grammar()
    if not grammar.order:
        raise GuidedFormatError("grammar: no rule or terminal is defined (output starts at `start`)")
    start = "start" if "start" in grammar.rules else grammar.order[0]
    ignored = None
    if grammar.ignored:
        grammar.define(_IGNORED, ("alt", grammar.ignored), line=0, terminal=True, written=False)
        ignored = _IGNORED
    return rules_regex(grammar.rules, start, frozenset(grammar.terminals), ignored)


class _Grammar:
    def __init__(self):
        self.rules: dict[str, object] = {}
        self.terminals: set[str] = set()
        self.order: list[str] = []
        self.ignored: list[object] = []

    def define(self, name: str, tree: object, line: int, terminal: bool | None = None, written: bool = True):
        """`terminal` by the name's case unless told; `written` definitions may be the start."""
        if name in self.rules:
            raise GuidedFormatError(f"grammar: {name!r} is defined twice (line {line})")
        self.rules[name] = tree
        if terminal or (terminal is None and name.lstrip("_")[:1].isupper()):
            self.terminals.add(name)
        if written:
            self.order.append(name)


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.at = 0
        self.grammar_ = _Grammar()

    # --- tokens -----------------------------------------------------------------------------------

    def _peek(self) -> tuple[str, str, int]:
        return self.tokens[min(self.at, len(self.tokens) - 1)]

    def _is(self, kind: str, value: str | None = None) -> bool:
        token = self._peek()
        return token[0] == kind and (value is None or token[1] == value)

    def _take(self, kind: str, value: str | None = None, wanted: str = "") -> str:
        if not self._is(kind, value):
            self._fail(f"expected {wanted or value or kind}")
        self.at += 1
        return self.tokens[self.at - 1][1]

    def _fail(self, message: str, token: tuple[str, str, int] | None = None):
        kind, value, line = token or self._peek()
        found = "the end" if kind == "end" else "a new line" if kind == "nl" else repr(value)
        raise GuidedFormatError(f"grammar: {message} (line {line}, at {found})")

    # --- definitions and directives ---------------------------------------------------------------

    def grammar(self) -> _Grammar:
        while not self._is("end"):
            if self._is("nl"):
                self.at += 1
            elif self._is("directive"):
                self._directive()
            else:
                self._definition()
        return self.grammar_

    def _end_of_line(self) -> None:
        if not self._is("end"):
            self._take("nl", wanted="the end of the line")

    def _definition(self) -> None:
        while self._is("punct", "?") or self._is("punct", "!"):
            self.at += 1  # rule modifiers: inline, keep tokens
        line = self._peek()[2]
        name = self._name()
        if self._is("punct", "{"):
            self._fail("templates (`name{...}`) are not supported")
        if self._is("punct", "."):
            self.at += 1
            self._take("number", wanted="a priority number after `.`")
        self._take("punct", ":", wanted="`:` after the name")
        self.grammar_.define(name, self._alternatives(), line)
        self._end_of_line()

    def _name(self) -> str:
        name = self._take("name", wanted="a rule or terminal name")
        if not re.fullmatch(r"_?[a-z][_a-z0-9]*|_?[A-Z][_A-Z0-9]*", name):
            self._fail(f"{name!r} mixes cases: a rule is lowercase, a terminal UPPERCASE", self.tokens[self.at - 1])
        return name

    def _directive(self) -> None:
        token = self._peek()
        self.at += 1
        if token[1] == "%ignore":
            self.grammar_.ignored.append(self._alternatives())
        elif token[1] == "%import":
            self._import(token[2])
        else:
            self._fail(f"{token[1]} is not supported (only %import and %ignore are)", token)
        self._end_of_line()

    def _import(self, line: int) -> None:
        path = [self._take("name", wanted="a library to import from")]
        while self._is("punct", "."):
            self.at += 1
            path.append(self._take("name", wanted="a name after `.`"))
        if self._is("punct", "("):
            self.at += 1
            names = [self._take("name", wanted="a name to import")]
            while self._is("punct", ","):
                self.at += 1
                names.append(self._take("name", wanted="a name to import"))
            self._take("punct", ")", wanted="`)` closing the imported names")
            library, pairs = path, [(n, n) for n in names]
        else:
            if len(path) < 2:
                self._fail("an import is `%import library.NAME` or `%import library (A, B)`")
            library, name = path[:-1], path[-1]
            alias = name
            if self._is("to"):
                self.at += 1
                alias = self._name()
            pairs = [(name, alias)]
        if library != ["common"]:
            self._fail(f"only Lark's `common` library can be imported, not {'.'.join(library)!r}")
        for name, alias in pairs:
            _import_common(self.grammar_, name, alias, line)

    # --- expansions -------------------------------------------------------------------------------

    def _alternatives(self) -> object:
        options = [self._aliased()]
        while self._is("punct", "|"):
            self.at += 1
            options.append(self._aliased())
        return ("alt", options) if len(options) > 1 else options[0]

    def _aliased(self) -> object:
        sequence = self._sequence()
        if self._is("to"):
            self.at += 1
            self._name()  # an alias names the tree's node; the language is the same
        return sequence

    def _sequence(self) -> object:
        items = []
        while not (self._is("end") or self._is("nl") or self._is("to")
                   or any(self._is("punct", p) for p in "|)]")):
            items.append(self._repeated(self._atom()))
        return ("seq", items)

    def _repeated(self, item: object) -> object:
        if any(self._is("punct", op) for op in "?*+"):
            return ("repeat", item, self._take("punct"))
        if not self._is("punct", "~"):
            return item
        self.at += 1
        low = int(self._take("number", wanted="a count after `~`"))
        if not self._is("dotdot"):
            return ("repeat", item, f"{{{low}}}")
        self.at += 1
        high = int(self._take("number", wanted="a count after `..`"))
        if low < 0 or high < low:
            self._fail(f"repetition ~{low}..{high} has its bounds the wrong way round", self.tokens[self.at - 1])
        return ("repeat", item, f"{{{low},{high}}}")

    def _atom(self) -> object:
        kind, value, _ = self._peek()
        if kind == "punct" and value in "([":
            self.at += 1
            inner = self._alternatives()
            self._take("punct", ")" if value == "(" else "]", wanted="`)`" if value == "(" else "`]`")
            return inner if value == "(" else ("repeat", inner, "?")
        if kind == "string":
            self.at += 1
            if self._is("dotdot"):
                self.at += 1
                return self._range(value, self._take("string", wanted="a string ending the range"))
            return self._literal(value)
        if kind == "regexp":
            self.at += 1
            return self._pattern(value)
        if kind == "name":
            name = self._name()
            if self._is("punct", "{"):
                self._fail("templates (`name{...}`) are not supported")
            return ("ref", name)
        self._fail("expected a string, a /pattern/, a name, `(` or `[`")

    def _literal(self, token: str) -> object:
        any_case = token.endswith("i") and token[-2] in "\"'"
        text = self._unescaped(token[1:-2] if any_case else token[1:-1])
        if not text:
            self._fail("empty strings are not allowed (Lark refuses them too)", self.tokens[self.at - 1])
        return ("regex", f"(?i:{text_regex(text)})") if any_case else ("text", text)

    def _range(self, low_token: str, high_token: str) -> object:
        low, high = (self._unescaped(t[1:-1]) for t in (low_token, high_token))
        if len(low) != 1 or len(high) != 1:
            self._fail('a range is two one-character strings ("a".."z")', self.tokens[self.at - 1])
        if ord(high) < ord(low):
            self._fail(f"range {low!r}..{high!r} runs backwards", self.tokens[self.at - 1])
        return ("class", f"[{class_char(low)}-{class_char(high)}]")

    def _pattern(self, token: str) -> object:
        end = token.rindex("/")
        body, flags = token[1:end], token[end + 1:]
        unknown = set(flags) - _REGEX_FLAGS
        if unknown:
            self._fail(f"pattern flag {''.join(sorted(unknown))!r} is not supported (i, m, s, x, u are)",
                       self.tokens[self.at - 1])
        try:
            re.compile(body)
        except re.error as e:
            self._fail(f"pattern {token} is not a valid regex: {e}", self.tokens[self.at - 1])
        inline = "".join(f for f in flags if f != "u")
        return ("regex", f"(?{inline}:{body})" if inline else body)

    def _unescaped(self, raw: str) -> str:
        """A string's text as Lark reads it: \\n \\t \\r \\f \\xHH \\uHHHH \\\\ \\" are escapes, and a
        backslash before any other character stands for itself."""
        out, i = [], 0
        while i < len(raw):
            c = raw[i]
            e = raw[i + 1:i + 2]
            if c != "\\" or not e:
                out.append(c)
                i += 1
            elif e in _HEX_DIGITS:
                digits = raw[i + 2:i + 2 + _HEX_DIGITS[e]]
                if not re.fullmatch(r"[0-9A-Fa-f]+", digits) or len(digits) != _HEX_DIGITS[e]:
                    self._fail(f"\\{e} wants {_HEX_DIGITS[e]} hex digits", self.tokens[self.at - 1])
                out.append(chr(int(digits, 16)))
                i += 2 + len(digits)
            else:
                out.append(_STRING_ESCAPES.get(e, "\\" + e))
                i += 2
        return "".join(out)


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, line) for each token; new lines before a `|` are dropped (the alternatives go on)."""
    tokens, at, line = [], 0, 1
    while at < len(text):
        match = _TOKEN.match(text, at)
        if not match:
            raise GuidedFormatError(f"grammar: unexpected {text[at:at + 20]!r} (line {line})")
        kind, value = match.lastgroup, match.group()
        if kind == "nl":
            if tokens and tokens[-1][0] != "nl":
                tokens.append(("nl", value, line))
        elif kind != "skip":
            if kind == "punct" and value == "|" and tokens and tokens[-1][0] == "nl":
                tokens.pop()
            tokens.append((kind, value, line))
        line += value.count("\n")
        at = match.end()
    tokens.append(("end", "", line))
    return tokens


@cache
def _common() -> dict[str, object]:
    """Lark's common terminals, each named `common__NAME` and using the others by those names."""
    return {"common__" + name: _renamed(tree) for name, tree in _Parser(COMMON).grammar().rules.items()}


def _import_common(grammar: _Grammar, name: str, alias: str, line: int) -> None:
    """`name` from Lark's common terminals as `alias`. The common terminals come along as `common__NAME`,
    as Lark names what an import uses, so a grammar's own DIGIT does not change the imported INT (the
    ones nothing uses are never expanded)."""
    common = _common()
    if "common__" + name not in common:
        raise GuidedFormatError(f"grammar: common has no terminal {name!r} (line {line})")
    for used, tree in common.items():
        if used not in grammar.rules:
            grammar.define(used, tree, line, terminal=True, written=False)
    grammar.define(alias, ("ref", "common__" + name), line, terminal=True, written=False)


def _renamed(tree):
    if tree[0] == "ref":
        return ("ref", "common__" + tree[1])
    if tree[0] in ("seq", "alt"):
        return (tree[0], [_renamed(item) for item in tree[1]])
    if tree[0] == "repeat":
        return ("repeat", _renamed(tree[1]), tree[2])
    return tree
