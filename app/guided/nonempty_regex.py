"""A pattern's non-empty strings, as a pattern outlines-core can anchor at its end.

compile_regex anchors every pattern with `$` (app/guided/compiler.py says why), but outlines-core
0.2.14 cannot build the start state of an anchored pattern that matches the empty string. Such a
pattern is rewritten, from Python's parse of it, into one that matches exactly its other
strings (compile_regex adds the empty one back where it can). The rewrite of a concatenation `AB` is
`A'B|B'` when A matches the empty string (X' is X without it), of `A*` is `A'A*`, and of a
group or alternation that of its parts.
"""

from __future__ import annotations

import re._constants as sre
import re._parser as sre_parse
from typing import Any

from app.guided.errors import GuidedFormatError

_FLAG_LETTERS = {sre.SRE_FLAG_IGNORECASE: "i", sre.SRE_FLAG_DOTALL: "s"}
_FLAGS_WITHOUT_MEANING_HERE = sre.SRE_FLAG_MULTILINE | sre.SRE_FLAG_VERBOSE | sre.SRE_FLAG_UNICODE
_CATEGORIES = {sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D", sre.CATEGORY_SPACE: r"\s",
               sre.CATEGORY_NOT_SPACE: r"\S", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W"}
_ONE_CHARACTER = (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN)
MAX_REWRITTEN_CHARS = 100_000  # a concatenation of n optional parts is rewritten into n^2/2 of them


def nonempty_form(regex: str) -> str | None:
    """`regex` itself when it cannot match the empty string; else a pattern (in the syntax both
    Python and outlines-core's Rust read) for its non-empty strings, or None when the empty
    string is all it matches. The pattern must have passed check_regex."""
    tree = sre_parse.parse(regex)
    if tree.getwidth()[0] > 0:  # re's own measure: every construct it parses, not only those rewritten
        return regex
    body = _nonempty_sequence(tree.data)
    if body is None:
        return None
    if len(body) > MAX_REWRITTEN_CHARS:
        raise GuidedFormatError("regex too large: it matches the empty string, and without that "
                                f"match it would be over {MAX_REWRITTEN_CHARS} characters")
    flags = _flag_letters(tree.state.flags)
    return f"(?{flags}:{body})" if flags else body


# --- which parts match the empty string --------------------------------------------------------

def _nullable_sequence(items: list) -> bool:
    return all(_nullable(item) for item in items)


def _nullable(item: tuple[Any, Any]) -> bool:
    op, av = item
    if op in _ONE_CHARACTER:
        return False
    if op is sre.BRANCH:
        return any(_nullable_sequence(alt.data) for alt in av[1])
    if op is sre.SUBPATTERN:
        return _nullable_sequence(av[3].data)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        return av[0] == 0 or _nullable_sequence(av[2].data)
    raise GuidedFormatError(f"unsupported regex construct: {op}")


# --- the rewrite: None is the empty language ----------------------------------------------------

def _nonempty_sequence(items: list) -> str | None:
    alternatives = []
    for i, item in enumerate(items):  # item i writes the first character; the ones before, none
        head = _nonempty(item)
        if head is not None:
            alternatives.append(head + _emit_sequence(items[i + 1:]))
        if not _nullable(item):
            break
    return _alternation(alternatives)


def _nonempty(item: tuple[Any, Any]) -> str | None:
    op, av = item
    if not _nullable(item):
        return _emit(item)
    if op is sre.BRANCH:
        return _alternation([x for x in (_nonempty_sequence(alt.data) for alt in av[1]) if x is not None])
    if op is sre.SUBPATTERN:
        inner = _nonempty_sequence(av[3].data)
        return None if inner is None else f"(?{_flag_change(av[1], av[2])}:{inner})"
    lo, hi, body = av  # a repeat
    if not _nullable_sequence(body.data):  # lo == 0: at least once
        return f"(?:{_emit_sequence(body.data)}){_count(1, hi)}" if hi != 0 else None
    first = _nonempty_sequence(body.data)
    if first is None or hi == 0:
        return None
    more = hi if hi == sre.MAXREPEAT else hi - 1
    return first + (f"(?:{_emit_sequence(body.data)}){_count(0, more)}" if more else "")


def _alternation(alternatives: list[str]) -> str | None:
    if not alternatives:
        return None
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


# --- emitting a parsed pattern -------------------------------------------------------------------

def _emit_sequence(items: list) -> str:
    return "".join(_emit(item) for item in items)


def _emit(item: tuple[Any, Any]) -> str:
    op, av = item
    if op is sre.LITERAL:
        return _character(av)
    if op is sre.NOT_LITERAL:
        return f"[^{_character(av)}]"
    if op is sre.ANY:
        return "."
    if op is sre.IN:
        return "[" + "".join(_class_member(member) for member in av) + "]"
    if op is sre.BRANCH:
        return "(?:" + "|".join(_emit_sequence(alt.data) for alt in av[1]) + ")"
    if op is sre.SUBPATTERN:
        return f"(?{_flag_change(av[1], av[2])}:{_emit_sequence(av[3].data)})"
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):  # laziness means nothing when the whole output must match
        lo, hi, body = av
        return f"(?:{_emit_sequence(body.data)}){_count(lo, hi)}"
    raise GuidedFormatError(f"unsupported regex construct: {op}")


def _class_member(member: tuple[Any, Any]) -> str:
    op, av = member
    if op is sre.NEGATE:
        return "^"
    if op is sre.LITERAL:
        return _character(av)
    if op is sre.RANGE:
        return f"{_character(av[0])}-{_character(av[1])}"
    if op is sre.CATEGORY and av in _CATEGORIES:
        return _CATEGORIES[av]
    raise GuidedFormatError(f"unsupported regex character class member: {op} {av}")


def _character(code: int) -> str:
    """One character, escaped unless it is an ASCII letter or digit."""
    c = chr(code)
    if c.isascii() and c.isalnum():
        return c
    if code < 0x100:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _count(lo: int, hi: int) -> str:
    short = {(0, 1): "?", (1, 1): "", (0, sre.MAXREPEAT): "*", (1, sre.MAXREPEAT): "+"}.get((lo, hi))
    if short is not None:
        return short
    if hi == sre.MAXREPEAT:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _flag_letters(flags: int) -> str:
    unknown = flags & ~(_FLAGS_WITHOUT_MEANING_HERE | sum(_FLAG_LETTERS))
    if unknown:
        raise GuidedFormatError(f"unsupported regex flag (value {unknown}); use i, s, m or x")
    return "".join(letter for flag, letter in _FLAG_LETTERS.items() if flags & flag)


def _flag_change(added: int, removed: int) -> str:
    off = _flag_letters(removed)
    return _flag_letters(added) + (f"-{off}" if off else "")
