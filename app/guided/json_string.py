"""A regex over a string's content -> the regex over that string's text inside JSON quotes.

outlines-core puts a schema's `pattern` (and its own `format` patterns) between quotes as they
are, so a pattern that can match `"`, `\\` or a control character lets the model write a JSON
string that does not parse (`"a"@b.c` for an email: issue 19). `json_text_regex` rewrites the
pattern so that every such character is matched by its JSON escape instead (`\\"`, `\\\\`,
`\\n`, `\\u001f`, ...): the decoded string still matches the original pattern, and the JSON
text always parses. One escape per character is allowed (the short form where JSON has one).

Positive `\\d` and `\\w` become ASCII (`[0-9]`, `[0-9A-Za-z_]`): Rust's Unicode tables are newer
than Python's, and a digit only Rust knows (U+1E5F2, seen here) fails `jsonschema`. Negated
ones keep their Unicode meaning (the Rust side is then the narrower one). Classes like `\\s` differ between Python's `re` and the Rust regex crate outlines-core uses
(Python counts \\x1c-\\x1f as space); where they differ, the rewrite allows only what both
accept, so the output validates under Python's `jsonschema` too.
"""

from __future__ import annotations

import re
import re._constants as sre_c
import re._parser as sre_parse

from app.guided.errors import GuidedFormatError
from app.guided.regex_check import check_regex

UNSAFE = [chr(c) for c in range(0x20)] + ['"', "\\"]
_SHORT = {'"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_EXCLUDED = r'"\\\x00-\x1f'  # inside a class: what a JSON string cannot hold raw
_SPACE_BOTH = set("\t\n\x0b\x0c\r")  # unsafe characters that Python and Rust both call \s
_PY_SPACE = _SPACE_BOTH | set("\x1c\x1d\x1e\x1f")


def _escape_text(ch: str) -> str:
    """The regex that matches the JSON escape of `ch` (an unsafe character)."""
    short = _SHORT.get(ch)
    return r"\\" + (_lit(short) if short is not None else f"u{ord(ch):04x}")


def _lit(ch: str) -> str:
    """`ch` as a regex atom both Python and Rust read the same way."""
    if ch.isalnum() and ord(ch) < 128 or ord(ch) >= 128:
        return ch
    return f"\\x{ord(ch):02x}"


def _category(cat, negated: bool = False) -> tuple[str, set[str]]:
    """(class-body text for the category, the unsafe characters it matches in both engines)."""
    table = {
        sre_c.CATEGORY_DIGIT: (r"\d" if negated else "0-9", set()),
        sre_c.CATEGORY_WORD: (r"\w" if negated else "0-9A-Za-z_", set()),
        sre_c.CATEGORY_SPACE: (r"\s", _SPACE_BOTH),
        sre_c.CATEGORY_NOT_DIGIT: (r"\D", set(UNSAFE)),
        sre_c.CATEGORY_NOT_WORD: (r"\W", set(UNSAFE)),
        sre_c.CATEGORY_NOT_SPACE: (r"\S", set(UNSAFE) - _PY_SPACE),
    }
    if cat not in table:
        raise GuidedFormatError(f"unsupported regex class {cat} in a string pattern")
    return table[cat]


def _set_members(items, negated: bool = False) -> tuple[list[str], set[str]]:
    """Class items -> (class-body pieces, unsafe characters matched), conservative on \\s."""
    pieces: list[str] = []
    unsafe: set[str] = set()
    for op, av in items:
        if op == sre_c.LITERAL:
            pieces.append(_lit(chr(av)))
            unsafe |= {chr(av)} & set(UNSAFE)
        elif op == sre_c.RANGE:
            lo, hi = av
            pieces.append(f"{_lit(chr(lo))}-{_lit(chr(hi))}")
            unsafe |= {c for c in UNSAFE if lo <= ord(c) <= hi}
        elif op == sre_c.CATEGORY:
            text, cat_unsafe = _category(av, negated)
            pieces.append(text)
            unsafe |= cat_unsafe
        else:
            raise GuidedFormatError(f"unsupported regex class item {op} in a string pattern")
    return pieces, unsafe


def _negated(items) -> str:
    """Any character not in `items`: the safe ones raw, the unsafe ones as escapes."""
    pieces, _ = _set_members(items, negated=True)
    body = "".join(pieces)
    # Unsafe characters outside the class in both engines (Python's \s is the wider one).
    outside = [c for c in UNSAFE if not re.fullmatch(f"[{body}]", c)] if body else UNSAFE
    return _alternatives([f"[^{body}{_EXCLUDED}]"], outside)


def _positive(items) -> str:
    """Characters in `items`: a class of the safe ones (unsafe ones cut out of ranges), the
    safe part of each category that holds unsafe characters, and the escapes of the unsafe."""
    safe: list[str] = []
    parts: list[str] = []
    unsafe: set[str] = set()
    for op, av in items:
        if op == sre_c.RANGE:
            lo, hi = av
            cuts = [ord(c) for c in UNSAFE if lo <= ord(c) <= hi]
            unsafe |= {chr(c) for c in cuts}
            for a, b in zip([lo] + [c + 1 for c in cuts], [c - 1 for c in cuts] + [hi]):
                if a <= b:
                    safe.append(f"{_lit(chr(a))}-{_lit(chr(b))}")
        elif op == sre_c.CATEGORY:
            text, cat_unsafe = _category(av)
            if cat_unsafe:  # \s \D \W \S: the safe part as a negated class of its own
                parts.append(f"[^{text.swapcase()}{_EXCLUDED}]")  # \S \d \w: see above
                unsafe |= cat_unsafe
            else:
                safe.append(text)
        else:
            pieces, u = _set_members([(op, av)])
            unsafe |= u
            safe += [] if u else pieces
    alts = ([f"[{''.join(safe)}]"] if safe else []) + parts
    return _alternatives(alts, sorted(unsafe))


def _alternatives(classes: list[str], unsafe) -> str:
    unsafe = sorted(unsafe)
    alts = classes + [_escape_text(c) for c in unsafe if c in _SHORT]
    codes = [f"{ord(c):02x}" for c in unsafe if c not in _SHORT]
    if codes:  # the \u00XX escapes as one alternative
        alts.append(r"\\u00" + (codes[0] if len(codes) == 1 else "(?:" + "|".join(codes) + ")"))
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _emit(items, dotall: bool) -> str:
    out = []
    for op, av in items:
        if op == sre_c.LITERAL:
            ch = chr(av)
            out.append(_escape_text(ch) if ch in UNSAFE else _lit(ch))
        elif op == sre_c.NOT_LITERAL:
            out.append(_negated([(sre_c.LITERAL, av)]))
        elif op == sre_c.ANY:
            out.append(_negated([] if dotall else [(sre_c.LITERAL, ord("\n"))]))
        elif op == sre_c.IN:
            negate = bool(av) and av[0][0] == sre_c.NEGATE
            out.append(_negated(av[1:]) if negate else _positive(av))
        elif op == sre_c.BRANCH:
            out.append("(?:" + "|".join(_emit(b, dotall) for b in av[1]) + ")")
        elif op == sre_c.SUBPATTERN:
            _, add_flags, _, sub = av
            if add_flags & ~(re.UNICODE | re.DOTALL):
                raise GuidedFormatError("inline regex flags other than (?s) are not supported in "
                                        "a string pattern")
            out.append("(?:" + _emit(sub, dotall or bool(add_flags & re.DOTALL)) + ")")
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = av
            bound = "" if hi == sre_c.MAXREPEAT else str(hi)
            out.append(f"(?:{_emit(sub, dotall)}){{{lo},{bound}}}")
        else:
            raise GuidedFormatError(f"unsupported regex feature {op} in a string pattern")
    return "".join(out)


def json_text_regex(pattern: str) -> str:
    """The regex of the JSON text (without its quotes) of the strings that fullmatch `pattern`,
    each unsafe character written as one escape."""
    tree = sre_parse.parse(check_regex(pattern))  # names unsupported features, drops ^...$
    if tree.state.flags & ~(re.UNICODE | re.DOTALL):
        raise GuidedFormatError("inline regex flags other than (?s) are not supported in a "
                                "string pattern")
    return _emit(tree.data, bool(tree.state.flags & re.DOTALL))
