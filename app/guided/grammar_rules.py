"""A grammar's rules, parsed from GBNF (ebnf.py) or Lark (lark_grammar.py), made into the one regex its
output must fullmatch. A rule is a tree of tuples:

    ("text", s)  ("class", "[a-z]")  ("any",)  ("regex", pattern)  ("ref", name)
    ("seq", [items])  ("alt", [options])  ("repeat", item, "*" | "+" | "?" | "{m}" | "{m,}" | "{m,n}")

outlines-core enforces regular languages only, so a rule that refers to itself, directly or through
others, is refused (GuidedFormatError, a 400), not cut at some depth.

Lark's terminals and `%ignore` are the one difference between the two syntaxes: a rule's words are
terminals (its strings, patterns and UPPERCASE names), and the ignored text (whitespace, comments) may
come before each of them and at the end; inside a terminal nothing is ignored.
"""

from __future__ import annotations

from app.guided.errors import GuidedFormatError

MAX_REGEX_CHARS = 200_000  # a grammar whose rules expand past this is refused, not compiled for minutes
_CLASS_SPECIAL = set("\\]^-[&~")  # escaped inside a class (outlines-core also reads && -- ~~)
_TEXT_SPECIAL = set("\\.^$|?*+()[]{}")  # escaped outside one (as compiler.escape_literal does)


def rules_regex(rules: dict[str, object], start: str, terminals: frozenset[str] = frozenset(),
                ignored: str | None = None) -> str:
    """The regex of rule `start`. `terminals` are the names whose expansion ignores nothing; `ignored`
    names the terminal (one of them) allowed before each terminal of a rule and at the end."""
    expander = _Expander(rules, terminals)
    if ignored is not None:
        expander.ignored = f"(?:{expander.rule(ignored, ())})*"
    return expander.rule(start, ()) + expander.ignored


def escaped(c: str, special: set[str]) -> str:
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\x{ord(c):02X}"
    return "\\" + c if c in special else c


def class_char(c: str) -> str:
    """`c` as it is written inside a character class."""
    return escaped(c, _CLASS_SPECIAL)


def text_regex(text: str) -> str:
    """The regex matching `text` itself."""
    return "".join(escaped(c, _TEXT_SPECIAL) for c in text)


class _Expander:
    def __init__(self, rules: dict[str, object], terminals: frozenset[str]):
        self.rules, self.terminals, self.ignored, self.done = rules, terminals, "", {}

    def rule(self, name: str, path: tuple[str, ...]) -> str:
        if name in path:
            cycle = " -> ".join(path[path.index(name):] + (name,))
            raise GuidedFormatError(f"grammar: rule {name!r} refers to itself ({cycle}); output formats are "
                                    "enforced as regular languages, so a recursive grammar is not supported")
        if name not in self.rules:
            raise GuidedFormatError(f"grammar: rule {name!r} is used but not defined")
        if name not in self.done:
            self.done[name] = self.node(self.rules[name], path + (name,), name in self.terminals)
        return self.done[name]

    def node(self, node, path: tuple[str, ...], in_terminal: bool) -> str:
        kind = node[0]
        if kind in ("seq", "alt", "repeat"):
            return self._compound(node, path, in_terminal)
        if kind == "ref" and in_terminal and node[1] not in self.terminals:
            raise GuidedFormatError(f"grammar: terminal {path[-1]!r} uses rule {node[1]!r}; a terminal is made "
                                    "of strings, patterns and other terminals only")
        starts_a_terminal = not in_terminal and (kind != "ref" or node[1] in self.terminals)
        before = self.ignored if starts_a_terminal else ""
        if kind == "text":
            return before + text_regex(node[1])
        if kind == "class":
            return before + node[1]
        if kind == "any":
            return before + r"[\s\S]"
        if kind == "regex":
            return before + f"(?:{node[1]})"
        return before + f"(?:{self.rule(node[1], path)})"  # ref

    def _compound(self, node, path: tuple[str, ...], in_terminal: bool) -> str:
        kind = node[0]
        if kind == "seq":
            return self._joined("", (self.node(item, path, in_terminal) for item in node[1]))
        if kind == "alt":
            return "(?:" + self._joined("|", (self.node(option, path, in_terminal) for option in node[1])) + ")"
        return f"(?:{self.node(node[1], path, in_terminal)}){node[2]}"  # repeat

    @staticmethod
    def _joined(separator: str, parts) -> str:
        """The parts joined, refused once they pass MAX_REGEX_CHARS (a rule used many times over)."""
        out, size = [], 0
        for part in parts:
            size += len(part) + len(separator)
            if size > MAX_REGEX_CHARS:
                raise GuidedFormatError(f"grammar: its rules expand past {MAX_REGEX_CHARS} characters of regex")
            out.append(part)
        return separator.join(out)
