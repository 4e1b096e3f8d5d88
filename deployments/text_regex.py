"""Regexes of text that does not hold a tag (what a model may write before its tool calls open,
and an XML parameter's text before its closing tag), of one of several tool calls, and of parts
in order of which some may be left out."""

from __future__ import annotations

from app.guided.compiler import escape_literal


def one_of(regexes: list[str]) -> str:
    """A regex matching any of `regexes` (the one itself when alone)."""
    return regexes[0] if len(regexes) == 1 else "(?:" + "|".join(regexes) + ")"


def in_order(parts: list[tuple[str, bool]], separator: str) -> str:
    """Parts (regex, required) in order, joined by `separator`, each present if required and
    perhaps if not (an object's members, a call's keywords). An alternative for each part that may
    come first: O(n²) regex, as outlines-core builds an object's optional properties."""
    separator = escape_literal(separator)
    alternatives = []
    for first, (regex, required) in enumerate(parts):
        rest = "".join(separator + r if needed else f"(?:{separator}{r})?" for r, needed in parts[first + 1:])
        alternatives.append(regex + rest)
        if required:
            break  # a required part cannot be left out, so none after it comes first
    else:
        alternatives.append("")
    return one_of(alternatives)


def not_char(c: str, *more: str) -> str:
    """A character class of every character but `c` (and `more`)."""
    return "[^" + "".join(f"\\x{ord(x):02x}" if ord(x) < 128 else x for x in (c, *more)) + "]"


def _not_starting_with(start: str, alphabet: str, *excluded: str) -> str:
    """Any text of `alphabet` (empty included) that does not begin with `start`; the characters
    `excluded` must be those `alphabet` lacks. Each character of `start` either goes on towards
    it, or differs and frees the rest."""
    out = ""
    for i in reversed(range(len(start))):
        differs = not_char(start[i], *excluded) + alphabet + "*"
        towards = escape_literal(start[i]) + out if i < len(start) - 1 else ""
        out = f"(?:{towards}|{differs})?" if towards else f"(?:{differs})?"
    return out


def text_without(tag: str, empty: bool = True) -> str:
    """Any text (`empty` included or not) that does not hold `tag`, whose first character must not
    recur in it: such text is its start up to the first `tag[0]`, then pieces that each begin with
    `tag[0]` and run to the next one, none of which begins with the whole tag."""
    first, rest = tag[0], tag[1:]
    other = not_char(first)
    piece = escape_literal(first) + _not_starting_with(rest, other, first)
    return f"{other}*(?:{piece})*" if empty else f"(?:{other}+(?:{piece})*|(?:{piece})+)"
