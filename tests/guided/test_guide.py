"""GuidedDecoder with the default tokenizer and real outlines-core: masks equal what the guide
allows, EOS only in a final state, rollback, draft masks, and jump-forward tokens."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
import torch
from outlines_core import Guide, Index
from transformers import PreTrainedTokenizerFast

from app.guided.compiler import regex_for_format
from app.guided.guide import GuidedDecoder, forced_bytes
from app.guided.vocabulary import (allocate_token_bitmask, build_guided_vocabulary, load_guided_vocabulary,
                                   unpack_token_bitmask)

TINY_TARGET = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-target"
WIDTH = 4096 + 64  # logits padded past the tokenizer's vocabulary
KEY_HEAVY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                              "age": {"type": "integer"}},
             "required": ["name", "age"]}
NESTED = {"type": "object", "properties": {
    "id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                        "minItems": 1, "maxItems": 3},
    "owner": {"type": "object", "properties": {"vip": {"type": "boolean"}}, "required": ["vip"]}},
    "required": ["id", "tags", "owner"]}


def allowed_mask(dec: GuidedDecoder) -> torch.Tensor:
    """bool[width], True where the decoder allows a token (the engine fills bitmask rows)."""
    bitmask = allocate_token_bitmask(1, dec.logits_width)
    dec.fill_bitmask(bitmask, 0)
    return unpack_token_bitmask(bitmask, dec.logits_width)[0]


def draft_masks(dec: GuidedDecoder, draft_ids: list[int]) -> torch.Tensor:
    """bool[1 + k, width]: `fill_draft_bitmasks` unpacked."""
    bitmask = allocate_token_bitmask(1 + len(draft_ids), dec.logits_width)
    dec.fill_draft_bitmasks(bitmask, 0, draft_ids)
    return unpack_token_bitmask(bitmask, dec.logits_width)


def schema_format(schema: dict, whitespace: str | None = None) -> dict:
    spec = {"type": "json_schema", "json_schema": {"schema": schema}}
    if whitespace is not None:
        spec["whitespace_pattern"] = whitespace
    return spec


@pytest.fixture(scope="module")
def tok():
    return PreTrainedTokenizerFast.from_pretrained(str(TINY_TARGET), local_files_only=True)


@pytest.fixture(scope="module")
def gv():
    return load_guided_vocabulary(TINY_TARGET)


@pytest.fixture(scope="module")
def nested_index(gv):
    return Index(regex_for_format(schema_format(NESTED)), gv.vocabulary)


def allowed_ids(mask: torch.Tensor) -> set[int]:
    return set(mask.nonzero().flatten().tolist())


def choose(dec: GuidedDecoder, rng: random.Random) -> int:
    """A random allowed token; EOS with p=0.5 once allowed."""
    allowed = allowed_ids(allowed_mask(dec))
    others = sorted(allowed - {dec.vocab.eos_token_id})
    if dec.vocab.eos_token_id in allowed and (not others or rng.random() < 0.5):
        return dec.vocab.eos_token_id
    return rng.choice(others)


def test_masks_equal_guide_and_eos_only_when_final(gv, nested_index):
    rng = random.Random(0)
    for _ in range(5):
        dec, ref = GuidedDecoder(nested_index, gv, WIDTH), Guide(nested_index)
        while True:
            mask = allowed_mask(dec)
            assert mask.shape == (WIDTH,) and not mask[4096:].any()
            assert allowed_ids(mask) == set(ref.get_tokens())
            assert bool(mask[gv.eos_token_id]) == dec.guide.is_finished() == ref.is_finished()
            disallowed = next(i for i in range(4096) if not mask[i])
            assert not dec.advance(disallowed) and allowed_ids(allowed_mask(dec)) == allowed_ids(mask)
            tid = choose(dec, rng)
            assert dec.advance(tid)
            if tid == gv.eos_token_id:
                break
            ref.advance(tid, return_tokens=False)
        assert dec.is_finished and allowed_ids(allowed_mask(dec)) == {gv.eos_token_id}  # a mask never used
        assert not dec.advance(gv.eos_token_id)  # but the decoder takes nothing after the end


def test_rollback_restores_masks_eos_included(gv, nested_index):
    rng = random.Random(1)
    dec = GuidedDecoder(nested_index, gv, WIDTH)
    masks = [allowed_mask(dec)]
    while not (dec.guide.is_finished() and dec.num_tokens >= 6):
        tid = choose(dec, rng)
        if tid == gv.eos_token_id:
            continue
        assert dec.advance(tid)
        masks.append(allowed_mask(dec))
    assert dec.advance(gv.eos_token_id) and dec.is_finished
    dec.rollback(1)  # the EOS: the guide did not move for it
    assert dec.guide.is_finished() and torch.equal(allowed_mask(dec), masks[-1])  # EOS allowed again
    n = dec.num_tokens
    dec.rollback(4)
    assert dec.num_tokens == n - 4 and torch.equal(allowed_mask(dec), masks[-5])
    dec.rollback(dec.num_tokens)
    assert torch.equal(allowed_mask(dec), masks[0])
    with pytest.raises(ValueError):
        dec.rollback(1)


def test_draft_masks_mix_of_allowed_and_disallowed(gv, tok):
    index = Index(regex_for_format({"type": "regex", "pattern": "[0-9]{2}-[a-z]{1,3}"}), gv.vocabulary)
    dec = GuidedDecoder(index, gv, WIDTH)
    first = tok.convert_tokens_to_ids("1")
    second = tok.convert_tokens_to_ids("2")
    dash = tok.convert_tokens_to_ids("-")
    letter = tok.convert_tokens_to_ids("a")
    # "1", "2" allowed, "a" not (a dash is due), then "-" (would be allowed after a dash).
    drafts = [first, second, letter, dash]
    masks = draft_masks(dec, drafts)
    assert masks.shape == (5, WIDTH)
    assert dec.num_tokens == 0 and torch.equal(masks[0], allowed_mask(dec))  # guide restored
    expected = []
    for tid in drafts[:2]:
        expected.append(allowed_mask(dec))
        dec.advance(tid)
    expected.append(allowed_mask(dec))
    for row, mask in enumerate(expected):
        assert torch.equal(masks[row], mask), row
    assert bool(masks[1][second]) and not masks[2][letter] and bool(masks[2][dash])
    assert allowed_ids(masks[3]) == {gv.eos_token_id} == allowed_ids(masks[4])  # after the refused draft: unused
    dec.rollback(2)
    assert dec.accept_prefix(drafts) == 2 and dec.num_tokens == 2
    # Bitmask form, into rows of a bigger batch buffer; an EOS draft in a final state.
    dec.accept_prefix([dash, letter])
    bitmask = torch.full((6, (WIDTH + 31) // 32), -1, dtype=torch.int32)
    assert dec.fill_draft_bitmasks(bitmask, 1, [gv.eos_token_id, letter]) == 1
    assert (bitmask[0] == -1).all() and (bitmask[4:] == -1).all()  # other rows untouched
    after_eos = unpack_token_bitmask(bitmask[2:4], WIDTH)
    assert allowed_ids(after_eos[0]) == {gv.eos_token_id} == allowed_ids(after_eos[1])  # unused, but finite
    assert dec.num_tokens == 4 and dec.guide.is_finished() and not dec.is_finished


@pytest.mark.parametrize("whitespace", [None, ""])
def test_forced_tokens_key_heavy(gv, tok, whitespace):
    index = Index(regex_for_format(schema_format(KEY_HEAVY, whitespace)), gv.vocabulary)
    rng = random.Random(2)
    for _ in range(4):
        dec, out, forced_text = GuidedDecoder(index, gv, WIDTH), b"", b""
        while not dec.is_finished:
            data, _ = forced_bytes(index, gv, dec.guide.get_state())
            forced = dec.forced_token_ids(tok)
            spelled = b"".join(gv.token_bytes[t] for t in forced)
            assert data.startswith(spelled)
            if forced:
                assert dec.accept_prefix(forced) == len(forced)
                out, forced_text = out + spelled, forced_text + spelled
                continue
            tid = choose(dec, rng)
            assert dec.advance(tid)
            out += gv.token_bytes[tid] if tid != gv.eos_token_id else b""
        jsonschema.validate(json.loads(out), KEY_HEAVY)
        assert b"name" in forced_text and b"age" in forced_text
    dec = GuidedDecoder(index, gv, WIDTH)
    start = forced_bytes(index, gv, dec.guide.get_state())[0]
    assert start == (b'{"name":"' if whitespace == "" else b"{")
    if whitespace == "":
        assert tok.decode(dec.forced_token_ids(tok)).startswith('{"name')
        assert dec.forced_token_ids(tok) == dec.forced_token_ids(tok)  # memoised, same answer


def test_forced_tokens_boundary(gv, tok):
    """The last token is dropped where a longer allowed token could replace it, kept at the end."""
    def compile_choices(*choices):
        return Index(regex_for_format({"type": "choice", "choices": list(choices)}), gv.vocabulary)

    dec = GuidedDecoder(compile_choices("alpha beta", "alpha gamma"), gv, WIDTH)
    assert forced_bytes(dec.index, gv, dec.guide.get_state())[0] == b"alpha "
    spelled = b"".join(gv.token_bytes[t] for t in dec.forced_token_ids(tok))
    assert b"alpha".startswith(spelled)  # " " could become " b" / " g": left to the model
    dec = GuidedDecoder(compile_choices("done!"), gv, WIDTH)
    forced = dec.forced_token_ids(tok)
    assert b"".join(gv.token_bytes[t] for t in forced) == b"done!"
    assert dec.accept_prefix(forced) == len(forced) and dec.is_finished


def test_forced_tokens_sentencepiece_style_only_accepted(tmp_path):
    from tests.guided.test_vocabulary import train_sentencepiece

    sp = train_sentencepiece(tmp_path)
    vocab = build_guided_vocabulary(sp)
    index = Index(regex_for_format(schema_format(KEY_HEAVY, "")), vocab.vocabulary)
    dec = GuidedDecoder(index, vocab, len(sp))
    data, _ = forced_bytes(index, vocab, dec.guide.get_state())
    assert data == b'{"name":"'
    forced = dec.forced_token_ids(sp)  # Metaspace prepends '▁': nothing that spells the text
    assert data.startswith(b"".join(vocab.token_bytes[t] for t in forced))
    assert dec.accept_prefix(forced) == len(forced)


def test_jump_forward_masks_allow_only_the_forced_token(gv, tok):
    """With jump-forward, a state that forces text allows exactly the token jump-forward would
    insert, in the plain mask and along drafts; elsewhere the masks are the grammar's."""
    index = Index(regex_for_format(schema_format(KEY_HEAVY, "")), gv.vocabulary)
    dec = GuidedDecoder(index, gv, WIDTH)
    forced = dec.forced_token_ids(tok)
    assert forced
    bitmask = allocate_token_bitmask(1, WIDTH)
    dec.fill_bitmask(bitmask, 0, jump_forward_tokenizer=tok)
    assert allowed_ids(unpack_token_bitmask(bitmask, WIDTH)[0]) == {forced[0]}
    assert forced[0] in allowed_ids(allowed_mask(dec))
    # Along the forced drafts: one-hot rows inside the forced text; after it (inside the
    # name's string, nothing forced) the grammar's own mask.
    rows = allocate_token_bitmask(1 + len(forced), WIDTH)
    assert dec.fill_draft_bitmasks(rows, 0, forced, jump_forward_tokenizer=tok) == len(forced)
    unpacked = unpack_token_bitmask(rows, WIDTH)
    assert allowed_ids(unpacked[0]) == {forced[0]}
    assert dec.accept_prefix(forced) == len(forced) and not dec.forced_token_ids(tok)
    assert allowed_ids(unpacked[len(forced)]) == allowed_ids(allowed_mask(dec))
