"""Patterns outlines-core's DFA builder cannot take, named before compiling (its own message is
opaque). Patterns are parsed with Python's `re` syntax, so Rust-only syntax is refused too."""

from __future__ import annotations

import re
import re._parser as sre_parse
from typing import Any

from app.guided.errors import GuidedFormatError

_REGEX_UNSUPPORTED = {
    "ASSERT": "lookaround assertions ((?=...), (?<=...))",
    "ASSERT_NOT": "negative lookaround assertions ((?!...), (?<!...))",
    "GROUPREF": "backreferences (\\1, (?P=name))",
    "GROUPREF_EXISTS": "conditional groups ((?(1)...))",
    "ATOMIC_GROUP": "atomic groups ((?>...))",
    "POSSESSIVE_REPEAT": "possessive quantifiers (*+, ++, ?+)",
    "AT": "anchors or word boundaries (^, $, \\b, \\A, \\Z) inside the pattern",
}


def _check_regex_tree(items: Any) -> None:
    for item in items:
        if isinstance(item, sre_parse.SubPattern):
            _check_regex_tree(item.data)
        elif isinstance(item, (list, tuple)):
            if len(item) == 2 and str(item[0]) in _REGEX_UNSUPPORTED:
                raise GuidedFormatError(f"unsupported regex feature: {_REGEX_UNSUPPORTED[str(item[0])]}")
            _check_regex_tree(item)


def check_regex(regex: str) -> str:
    """Validate a pattern and return it with an outer ^...$ removed (guides always match the
    whole output, and outlines-core fails on anchors)."""
    if regex.startswith("^"):
        regex = regex[1:]
    body = regex[:-1]
    if regex.endswith("$") and (len(body) - len(body.rstrip("\\"))) % 2 == 0:
        regex = body  # an even number of backslashes before '$': an anchor, not a literal
    try:
        tree = sre_parse.parse(regex)
    except re.error as e:
        raise GuidedFormatError(f"invalid regex: {e}") from None
    except RecursionError:
        raise GuidedFormatError("invalid regex: nested too deeply") from None
    _check_regex_tree(tree.data)
    return regex
