"""Reasoning split from the answer (deployments/reasoning.py): the same split whole or streamed
in any pieces, and the grammar that leaves the reasoning free and holds the answer to a format,
checked against Python's `re` and against real outlines-core over the default tokenizer."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from app.guided.compiler import compile_regex
from app.guided.guide import CompiledFormat
from app.guided.vocabulary import build_guided_vocabulary
from deployments.chat_protocol import ChatCompletionRequest
from deployments.reasoning import (REASONING_PARSERS, ReasoningStream, ReasoningTags, reasoning_tags, split_reasoning,
                                   thinking_then, thinks, without_closing_tag)

TINY_TARGET = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny-target"

SPLITS = [  # output -> (reasoning, answer)
    ("<think>\nplan it</think>\n\nThe answer.", ("\nplan it", "The answer.")),
    ("plan it</think>The answer.", ("plan it", "The answer.")),
    ("still thinking when cut", ("still thinking when cut", "")),
    ("a < b, so </th is no tag</think>\nyes", ("a < b, so </th is no tag", "yes")),
    ("<think>a</think>b</think>c", ("a", "b</think>c")),
    ("</think>", ("", "")),
    ("<thi", ("<thi", "")),
    ("x</thin", ("x</thin", "")),
    ("<<</think>\n\n\nlast\n", ("<<", "last\n")),
    ("", ("", "")),
]


@pytest.mark.parametrize("text, expected", SPLITS)
def test_a_whole_output_splits_at_the_first_closing_tag(text, expected):
    assert split_reasoning(text) == expected


@pytest.mark.parametrize("text, expected", SPLITS)
def test_streamed_in_any_pieces_the_split_is_the_same(text, expected):
    for cuts in itertools.chain(itertools.combinations(range(1, len(text)), 1),
                                itertools.combinations(range(1, len(text)), 2)):
        pieces = [text[i:j] for i, j in zip((0, *cuts), (*cuts, len(text)))]
        stream = ReasoningStream()
        sent = [stream.feed(piece) for piece in pieces] + [stream.finish()]
        assert ("".join(r for r, _ in sent), "".join(a for _, a in sent)) == expected, pieces


def test_a_tag_is_held_only_while_it_may_still_be_one():
    stream = ReasoningStream()
    assert stream.feed("<th") == ("", "")  # maybe <think>
    assert stream.feed("ey") == ("<they", "")
    assert stream.feed(" said </") == (" said ", "")  # maybe </think>
    assert stream.feed("b>") == ("</b>", "")
    assert stream.feed("</think>") == ("", "")
    assert stream.feed("\n") == ("", "")  # newlines after the tag are dropped
    assert stream.feed("Yes</think>") == ("", "Yes</think>")  # the answer passes as it comes


def test_reasoning_tokens_end_at_the_token_that_completed_the_tag():
    """However the tokens came in events (several steps at once, drafts), with the tokenizer's
    decode the count stops at the token that wrote `</think>`'s last character."""
    texts = {1: "<think>", 2: "pla", 3: "n</", 4: "th", 5: "ink>", 6: "\n\n", 7: "yes", 8: "!"}
    decode = lambda ids: "".join(texts[i] for i in ids)  # noqa: E731
    ids = list(texts)
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, len(ids)), k) for k in range(len(ids))):
        events = [ids[a:b] for a, b in zip((0, *cuts), (*cuts, len(ids)))]
        for with_decode, expected in ((True, 5), (False, None)):
            stream = ReasoningStream(thinking=True, decode=decode if with_decode else None)
            split = [stream.take(decode(e), last=e is events[-1], token_ids=e) for e in events]
            assert ("".join(r for r, _ in split), "".join(a for _, a in split)) == ("plan", "yes!")
            ending = next(e for e in events if 5 in e)  # without decode, all of its tokens count
            assert stream.reasoning_tokens == (expected or ids.index(ending[-1]) + 1), events
    unfinished = ReasoningStream(thinking=True, decode=decode)
    unfinished.take("<think>pla", last=False, token_ids=[1, 2])
    unfinished.take("n</", last=True, token_ids=[3])
    assert unfinished.reasoning_tokens == 3  # cut while thinking: all reasoning
    answering = ReasoningStream(thinking=False, decode=decode)
    answering.take("plan</think>", last=True, token_ids=[2, 3, 4, 5])
    assert answering.reasoning_tokens == 0


def test_without_thinking_all_is_answer():
    assert split_reasoning("abc</think>\nd", thinking=False) == ("", "abc</think>\nd")


def test_who_thinks():
    assert not thinks(None, None)
    assert thinks("deepseek_r1", {"enable_thinking": False})  # R1 always thinks
    assert thinks("qwen3", None) and thinks("qwen3", {"enable_thinking": True})
    assert not thinks("qwen3", {"enable_thinking": False})
    with_effort = [ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], reasoning_effort=effort)
                   for effort in ("none", "low")]
    assert [thinks("qwen3", r.template_variables) for r in with_effort] == [False, True]
    assert thinks("mimo", None) and not thinks("mimo", {"enable_thinking": False})
    assert thinks("minimax_m2", {"enable_thinking": False}) and thinks("step3", {"thinking": False})
    assert not thinks("deepseek_v3", None) and not thinks("deepseek_v3", {"thinking": False})
    assert thinks("deepseek_v3", {"thinking": True}) and thinks("deepseek_v3", {"enable_thinking": True})
    for parser in ("glm45", "glm47", "kimi_k2", "holo2"):  # on unless a switch is set and none is on
        assert [thinks(parser, kwargs) for kwargs in ({}, {"thinking": False}, {"enable_thinking": False},
                                                     {"thinking": False, "enable_thinking": True})] == \
            [True, False, False, True]
    assert not thinks("glm45", with_effort[0].template_variables)


@pytest.mark.parametrize("end", ["</think>", "</seed:think>", "[/THINK]", "<channel|>"])
def test_the_free_reasoning_regex_is_exactly_text_without_the_closing_tag(end):
    free = re.compile(without_closing_tag(end), re.DOTALL)
    alphabet = sorted(set(end)) + ["x"]
    texts = ["".join(t) for n in range(5) for t in itertools.product(alphabet, repeat=n)]
    rng = random.Random(0)
    pieces = [end, end[:-1], end[:5], "<", "</", end[2:], "a", "\n", ">", "/", end[0], end[:2]]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(5000)]
    for text in texts:
        assert (free.fullmatch(text) is not None) == (end not in text), repr(text)


SEED = reasoning_tags("seed_oss")


def test_seed_oss_reasons_in_its_own_tags_and_thinks_unless_switched_off():
    assert SEED == ReasoningTags("<seed:think>", "</seed:think>") and reasoning_tags("qwen3") == ReasoningTags()
    assert split_reasoning("<seed:think>plan</think> on</seed:think>\nyes", tags=SEED) == ("plan</think> on", "yes")
    text = "<seed:think>a <seed:x> b</seed:thin</seed:think>\n\nok"
    for cut in range(1, len(text)):
        stream = ReasoningStream(tags=SEED)
        sent = [stream.feed(text[:cut]), stream.feed(text[cut:]), stream.finish()]
        assert ("".join(r for r, _ in sent), "".join(a for _, a in sent)) == ("a <seed:x> b</seed:thin", "ok"), cut
    assert thinks("seed_oss", None) and not thinks("seed_oss", {"enable_thinking": False})
    whole = re.compile(thinking_then("yes|no", SEED), re.DOTALL)
    assert whole.fullmatch("<seed:think>hmm </think></seed:think>\nno") and whole.fullmatch("plan</seed:think>yes")
    assert not whole.fullmatch("plan</think>yes") and not whole.fullmatch("a</seed:think>b</seed:think>yes")
    with pytest.raises(ValueError):
        ReasoningTags("{think}", "{/think}")


# The parsers whose model reasons only where it opens its reasoning, and their tags.
OPTIONAL_TAGS = {"mistral": ("[THINK]", "[/THINK]"), "gemma4": ("<|channel>thought\n", "<channel|>"),
                 "cohere_command3": ("<|START_THINKING|>", "<|END_THINKING|>")}


def optional_splits(tags: ReasoningTags) -> list[tuple[str, tuple[str, str]]]:
    """Outputs -> (reasoning, answer): reasoning only where the output opens it."""
    start, end = tags.start, tags.end
    return [(f"{start}plan it{end}The answer.", ("plan it", "The answer.")),
            (f"The answer, {start} and all.", ("", f"The answer, {start} and all.")),
            (f"{start}a {end[:-1]} b{end}\nc", (f"a {end[:-1]} b", "c")),  # the end's beginning is reasoning
            (f"{start}cut while thinking", ("cut while thinking", "")),
            (start[:4], ("", start[:4])),
            ("", ("", ""))]


def assert_every_cut_splits(text: str, expected: tuple[str, str], tags: ReasoningTags) -> None:
    """Streamed in two pieces cut anywhere, an optional reasoning's output splits as `expected`, and
    one that never opens its reasoning counts none of its tokens as reasoning."""
    for cut in range(len(text) + 1):
        stream = ReasoningStream(tags=tags)
        sent = [stream.take(text[:cut], last=False, token_ids=[1]), stream.take(text[cut:], last=True, token_ids=[2])]
        assert ("".join(r for r, _ in sent), "".join(a for _, a in sent)) == expected, cut
        if not expected[0] and not text.startswith(tags.start):
            assert stream.reasoning_tokens == 0, cut  # an answer's tokens are not reasoning's


@pytest.mark.parametrize("parser", OPTIONAL_TAGS)
def test_an_optional_reasoning_is_reasoning_only_where_the_output_opens_it(parser):
    tags = reasoning_tags(parser)
    assert tags == ReasoningTags(*OPTIONAL_TAGS[parser], optional=True)
    assert thinks(parser, None) and thinks(parser, {"enable_thinking": False})  # the model decides
    for text, expected in optional_splits(tags):
        assert_every_cut_splits(text, expected, tags)
    start, end = tags.start, tags.end
    whole = re.compile(thinking_then("yes|no", tags), re.DOTALL)
    assert whole.fullmatch("yes") and whole.fullmatch(f"{start}a < b [ {end[:-1]}{end}\n\nno")
    assert not whole.fullmatch(f"plan{end}no") and not whole.fullmatch(f"{start}plan") and \
        not whole.fullmatch(f"{start}a{end}b{end}yes")


def test_every_parser_with_optional_tags_is_tested():
    assert {p for p in REASONING_PARSERS if reasoning_tags(p).optional} == set(OPTIONAL_TAGS)


def test_the_answer_format_holds_only_after_the_reasoning():
    whole = re.compile(thinking_then("yes|no"), re.DOTALL)
    for text in ("<think>\nhmm </thin <</think>\n\nyes", "plan</think>no", "</think>yes"):
        assert whole.fullmatch(text), text
    for text in ("plan", "plan</think>maybe", "a</think>b</think>yes", "yes", "plan</think>\n\n\nyes"):
        assert not whole.fullmatch(text), text


@pytest.mark.parametrize("tags", [ReasoningTags(), ReasoningTags("<seed:think>", "</seed:think>"),
                                  *map(reasoning_tags, OPTIONAL_TAGS)], ids=lambda tags: tags.start)
def test_outlines_core_compiles_it_and_frees_the_reasoning_then_masks_the_answer(tags):
    tokenizer = AutoTokenizer.from_pretrained(TINY_TARGET)
    vocab = build_guided_vocabulary(tokenizer)
    decoder = CompiledFormat(compile_regex(thinking_then("yes|no", tags), vocab), vocab).decoder(4096)
    reasoning = tokenizer.encode(f"{tags.start}\nif a<b then {tags.end[:-2]}<", add_special_tokens=False)
    for token in reasoning:
        assert decoder.advance(token)
    for token in tokenizer.encode(f"{tags.end}\n", add_special_tokens=False):
        assert decoder.advance(token)
    words = {w: tokenizer.encode(w, add_special_tokens=False)[0] for w in ("yes", "no", "maybe", "plan")}
    allowed = {w: decoder.allows(t) for w, t in words.items()}
    assert allowed == {"yes": True, "no": True, "maybe": False, "plan": False}
