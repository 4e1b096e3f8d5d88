"""Grammars in Lark's syntax (app/guided/lark_grammar.py; OpenAI's custom tools' `syntax: "lark"`, and
vLLM's `structured_outputs.grammar`): Lark itself is the judge. Every random walk through the compiled
automaton is a text Lark's own parser takes, and texts in and out of each grammar are taken or refused
by both; a grammar that cannot be enforced is refused with its reason."""

from __future__ import annotations

import random
import re

import lark
import pytest

from app.guided.compiler import compile_regex, regex_for_format
from app.guided.errors import GuidedFormatError
from app.guided.ebnf import is_gbnf
from app.guided.vocabulary import load_guided_vocabulary
from tests.checkpoints import DEFAULT_TARGET
from tests.guided.test_string_formats import accepts, distances_to_final, walk

SQL = r'''
// a query over one table, words apart by any whitespace
start: select_stmt [where] ";"?
select_stmt: "SELECT"i columns "FROM"i NAME
columns: "*" | NAME ("," NAME)~0..2
?where: "WHERE"i NAME "=" (NUMBER | ESCAPED_STRING)  -> where_clause
NAME.2: /[a-z_][a-z0-9_]*/
%import common.NUMBER
%import common.ESCAPED_STRING
%import common.WS
%ignore WS
'''
CALL = r'''
start: CNAME "(" [arg ("," arg)~0..3] ")"
arg: SIGNED_NUMBER | ESCAPED_STRING
   | "true" | "false"   # the alternatives go on over lines that start with |
%import common (CNAME, SIGNED_NUMBER, ESCAPED_STRING, WS_INLINE)
%ignore WS_INLINE
'''
PATCH = r'''
start: begin hunk+ end
begin: "*** Begin Patch" LF
end: "*** End Patch" LF?
hunk: "*** Update File: " FILENAME LF line~1..4
line: /[ +\-][^\n]*/ LF
FILENAME: /[\w.\/-]+/
%import common.LF
'''
DATES = r'''
start: DATE ("T" TIME)?
DATE: D~4 "-" ("0" "1".."9" | "1" "0".."2") "-" D D
TIME: ("0".."1" D | "2" "0".."3") ":" "0".."5" D ZONE?
ZONE: /z/i | /[+-]\d\d:\d\d/
D: "0".."9"
'''
# grammar -> (texts in its language, texts not in it)
GRAMMARS = {
    "sql": (SQL, ['SELECT * FROM users;', "select a,b FROM t WHERE a = 4.5", 'SELECT x FROM t\nwhere y="a \\" b"',
                  "  SELECT\t*\nFROM t  ;  "],
            ["SELECT FROM t", "SELECT a,b,c,d FROM t", "SELECT * FROM T", 'SELECT * FROM t WHERE a = "b',
             "SELECT * FROM t;;"]),
    "call": (CALL, ["f()", 'get_weather("Paris", -3.5e2, true)', "g ( 1 ,2 )", "_x1(false)"],
             ["f(", "1f()", "f(1,2,3,4,5)", "f(\n1)", "f(True)"]),
    "patch": (PATCH, ["*** Begin Patch\n*** Update File: a/b.py\n-old\n+new\n*** End Patch\n",
                      "*** Begin Patch\n*** Update File: x\n ctx\n*** Update File: y\n+1\n*** End Patch"],
              ["*** Begin Patch\n*** End Patch\n", "*** Begin Patch\n*** Update File: x\nnew\n*** End Patch\n"]),
    "dates": (DATES, ["2026-12-07", "2026-12-07T23:59", "1999-01-31T00:00Z", "2000-10-01T12:30+01:00"],
                ["2026-13-07", "2026-00-01", "2026-12-07T24:00", "2026-12-07T12:60", "2026-12-07T1:00"]),
}


@pytest.fixture(scope="module")
def vocab():
    return load_guided_vocabulary(DEFAULT_TARGET)


def lark_takes(grammar: str, text: str) -> bool:
    """Lark's own Earley parser, trying every split into terminals (the grammar's language itself)."""
    try:
        lark.Lark(grammar, start="start", lexer="dynamic_complete").parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


@pytest.mark.parametrize("name", GRAMMARS)
def test_a_lark_grammar_allows_what_lark_parses_and_nothing_else(vocab, name):
    grammar, inside, outside = GRAMMARS[name]
    assert not is_gbnf(grammar)
    index = compile_regex(regex_for_format({"type": "grammar", "grammar": grammar}), vocab)
    for text in inside:
        assert lark_takes(grammar, text) and accepts(index, vocab, text), text
    for text in outside:
        assert not lark_takes(grammar, text) and not accepts(index, vocab, text), text
    dist, rng = distances_to_final(index), random.Random(0)
    for _ in range(30):
        written = walk(index, vocab, dist, rng, stop_p=0.3).decode()
        assert lark_takes(grammar, written), written


def test_without_start_the_first_definition_is_the_output_as_vllm_reads_it():
    regex = regex_for_format({"type": "grammar", "grammar": "greeting: 'hello' | 'hi' NAME\nNAME: /[A-Z]\\w*/"})
    assert re.fullmatch(regex, "hello") and re.fullmatch(regex, "hiAda") and not re.fullmatch(regex, "hi")


def test_an_imported_terminal_keeps_what_it_uses_from_common():
    grammar = 'start: INT DIGIT\nDIGIT: "x"\n%import common.INT'
    regex = regex_for_format({"type": "grammar", "grammar": grammar})
    for text, taken in [("12x", True), ("123", False), ("x", False)]:
        assert lark_takes(grammar, text) == taken and bool(re.fullmatch(regex, text)) == taken, text


def test_strings_read_escapes_as_lark_does():
    grammar = r'start: "a\"b" "\\" "\x41\u00e9" "\d" "\t"'
    regex = regex_for_format({"type": "grammar", "grammar": grammar})
    assert lark_takes(grammar, 'a"b\\Aé\\d\t') and re.fullmatch(regex, 'a"b\\Aé\\d\t')


def test_gbnf_and_lark_are_told_apart_by_a_gbnf_rule_line():
    assert is_gbnf('root ::= "a"') and is_gbnf('# c\n  root-x ::= "a" | b\nb ::= "c"')
    assert not is_gbnf('start: "a ::= b"') and not is_gbnf("start: x\nx: 'y'")


@pytest.mark.parametrize("grammar, message", [
    ('start: "(" start ")" | "x"', "rule 'start' refers to itself (start -> start)"),
    ("start: list\nlist: \"[\" [item (\",\" item)*] \"]\"\nitem: \"1\" | list",
     "rule 'list' refers to itself (list -> item -> list)"),
    ("start: value", "rule 'value' is used but not defined"),
    ('start: "a"\nstart: "b"', "'start' is defined twice (line 2)"),
    ('start: A\nA: "x" b\nb: "y"', "terminal 'A' uses rule 'b'"),
    ('start: ("a" | "b"', "expected `)` (line 1, at the end)"),
    ('start: ("a"\n "b")', "expected `)` (line 1, at a new line)"),
    ('start: "a"~3..1', "the wrong way round"),
    ('start: "z".."a"', "runs backwards"),
    ('start: "ab".."c"', "a range is two one-character strings"),
    ('start: ""', "empty strings are not allowed"),
    ("start: /a(/", "is not a valid regex"),
    ("start: /a/l", "pattern flag 'l' is not supported"),
    ("start: Name", "mixes cases"),
    ('start: _sep{"a"}', "templates"),
    ("%declare X\nstart: X", "%declare is not supported"),
    ('%override start: "a"', "%override is not supported"),
    ("%import python.NAME\nstart: NAME", "only Lark's `common` library can be imported, not 'python'"),
    ("%import common.NOPE\nstart: NOPE", "common has no terminal 'NOPE'"),
    ('start: "a" = "b"', "unexpected '= \"b\"' (line 1)"),
    ("%import common.WS\n%ignore WS", "no rule or terminal is defined"),
    ("start: /a^b/", "anchors"),
])
def test_a_lark_grammar_that_cannot_be_enforced_names_the_problem(grammar, message):
    with pytest.raises(GuidedFormatError, match=re.escape(message)):
        regex_for_format({"type": "grammar", "grammar": grammar})
