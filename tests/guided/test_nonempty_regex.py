"""A pattern that matches the empty string is rewritten for its other strings (outlines-core
cannot anchor it as it is): checked against Python's `re` on every short string."""

from __future__ import annotations

import itertools
import re

import pytest

from app.guided.errors import GuidedFormatError
from app.guided.nonempty_regex import nonempty_form

ALPHABET = "abcxA1\n é"


@pytest.mark.parametrize("pattern", [
    "(?:xa)?", "(?:|a)", "a*", "(?:a|ab)?c?", "[ab]*c?", "(?:a?b?){2,3}", "(?i)(?:A|bc)*",
    "(?:a*|b)(?:c|)", "(?:(?:)|a){0,2}b?", "(?:a+?)?", "[^a]?", r"(?:\d|x)*", r"[\s\w]?", "(?s:.)?",
    "(?s).?", ".?", "(?:ab){0}c?", "(?:a|(?:b|))(?:(?i:X)|c?)", "é?(?:\u4e2d)?", "(?i:a(?-i:A)?)?",
    "(a)?(?P<n>b)*",
])
def test_the_rewrite_matches_every_string_but_the_empty_one(pattern):
    rewritten = nonempty_form(pattern)
    wrong = [text for n in range(5) for text in map("".join, itertools.product(ALPHABET, repeat=n))
             if bool(re.fullmatch(rewritten, text)) != (text != "" and bool(re.fullmatch(pattern, text)))]
    assert wrong == [], rewritten


def test_a_pattern_that_cannot_match_the_empty_string_is_kept_as_written():
    assert nonempty_form("a+b?") == "a+b?"
    assert nonempty_form("(?:a?b)|c*d") == "(?:a?b)|c*d"


@pytest.mark.parametrize("pattern", ["", "(?:)", "a{0}", "(?:a{0})*|(?:)"])
def test_a_pattern_of_only_the_empty_string_has_no_other_form(pattern):
    assert nonempty_form(pattern) is None


def test_what_cannot_be_rewritten_is_a_format_error():
    with pytest.raises(GuidedFormatError, match="flag"):
        nonempty_form("(?a)x?")  # ASCII-only classes: neither Rust's syntax nor ours
    with pytest.raises(GuidedFormatError, match="too large"):
        nonempty_form("a?" * 500)  # n optional parts rewrite into n^2/2
