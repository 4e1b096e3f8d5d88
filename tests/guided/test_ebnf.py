"""Grammars in GBNF (app/guided/ebnf.py, vLLM's `structured_outputs.grammar`): what the compiled automaton
lets a model write is the grammar's language, checked against a regex written by hand for each grammar,
by random walks through the automaton and by texts it must take or refuse; a grammar that cannot be
enforced is refused with its reason."""

from __future__ import annotations

import random
import re

import pytest

from app.guided.compiler import compile_regex, regex_for_format
from app.guided.errors import GuidedFormatError
from app.guided.vocabulary import load_guided_vocabulary
from tests.checkpoints import DEFAULT_TARGET
from tests.guided.test_string_formats import accepts, distances_to_final, walk

# vLLM's documented example
SQL = '''
root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
'''
LIST = r'''
# one to three items; an item is a number or a JSON string
root ::= "[" item ("," item){0,2} "]"
item ::= number
       | string   # either
number ::= "-"? [0-9]+
string ::= "\"" [^"\\\x00-\x1F]* "\""
'''
SPECIALS = r'''root ::= [\]\-^a&] "\u00e9.*" . [a-c]{2,} "\\"'''
# grammar -> (its language as a regex written by hand, texts in it, texts not in it)
GRAMMARS = {
    "sql": (SQL, r"SELECT (col_1 |col_2 ) from (table_1 |table_2 ) where (col_1 |col_2 )= (1 |2 )",
            ["SELECT col_1  from table_2  where col_2 = 1 "], ["SELECT col_3  from table_2  where col_2 = 1 ",
                                                             "SELECT col_1 from table_2 where col_2 = 1"]),
    "list": (LIST, r'\[(-?[0-9]+|"[^"\\\x00-\x1F]*")(,(-?[0-9]+|"[^"\\\x00-\x1F]*")){0,2}\]',
             ['[1,"a b",-20]', '[""]', "[7]"], ["[1,2,3,4]", '["a\\"]', "[]", "[--1]", '["\n"]']),
    "specials": (SPECIALS, r'[\]\-^a&]é\.\*[\s\S][a-c]{2,}\\', ["]é.*\nab\\", "-é.*xccc\\", "&é.*!abcab\\"],
                 ["bé.*xab\\", "aé.*xa\\", "aéxxab\\"]),
}


@pytest.fixture(scope="module")
def vocab():
    return load_guided_vocabulary(DEFAULT_TARGET)


@pytest.mark.parametrize("name", GRAMMARS)
def test_a_grammar_allows_its_language_and_nothing_else(vocab, name):
    grammar, language, inside, outside = GRAMMARS[name]
    index = compile_regex(regex_for_format({"type": "grammar", "grammar": grammar}), vocab)
    for text in inside:
        assert re.fullmatch(language, text) and accepts(index, vocab, text), text
    for text in outside:
        assert not re.fullmatch(language, text) and not accepts(index, vocab, text), text
    dist, rng = distances_to_final(index), random.Random(0)
    for _ in range(30):
        written = walk(index, vocab, dist, rng, stop_p=0.3).decode()
        assert re.fullmatch(language, written), written


@pytest.mark.parametrize("grammar, message", [
    ('root ::= "a" root | "b"', "rule 'root' refers to itself (root -> root)"),
    ('root ::= list\nlist ::= "[" (item ("," item)*)? "]"\nitem ::= "1" | list',
     "rule 'list' refers to itself (list -> item -> list)"),
    ('root ::= value', "rule 'value' is used but not defined"),
    ('start ::= "a"', "no `root` rule"),
    ('root ::= ("a" | "b"', "a group is not closed"),
    ('root ::= [z-a]', "runs backwards"),
    ('root ::= "a"{3,1}', "the wrong way round"),
    ('root ::= "a"{x}', "a repetition is {m}, {m,} or {m,n}"),
    (r'root ::= "\q"', "unknown escape \\q"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ('root ::= []', "empty character class"),
    ('root ::= "a\nb"', "unterminated string"),
    ("root ::= 'a'", "expected a string"),
    ('"a"\nroot ::= "b"', "expected a rule, `name ::= ...` (line 1"),
    ("root ::= " + "a " * 30 + "\na ::= " + "b " * 30 + "\nb ::= " + "c " * 30 + '\nc ::= "0123456789"',
     "expand past 200000 characters"),
])
def test_a_grammar_that_cannot_be_enforced_names_the_problem(grammar, message):
    with pytest.raises(GuidedFormatError, match=re.escape(message)):
        regex_for_format({"type": "grammar", "grammar": grammar})


def test_rules_used_twice_are_one_language_and_rules_may_span_lines():
    grammar = 'root ::= pair ";" pair\npair ::= key\n  "=" key\nkey ::= [a-z]{1,3}'
    regex = regex_for_format({"type": "grammar", "grammar": grammar})
    assert re.fullmatch(regex, "ab=c;x=yz") and not re.fullmatch(regex, "ab=c;x=")
