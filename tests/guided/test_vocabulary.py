"""Vocabulary round trips (byte-level BPE and SentencePiece-style), shared strings, special
tokens, and guide-driven bitmasks. Tokenizers are trained in the test: small and fast."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
from outlines_core import Guide, Index
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from app.guided.vocabulary import (GuidedVocabulary, allocate_token_bitmask, apply_token_bitmask,
                                   build_guided_vocabulary, fill_token_bitmask,
                                   load_guided_vocabulary, unpack_token_bitmask)

CORPUS = ["the quick brown fox jumps over the lazy dog, the end.",
          "héllo wörld, café crème brûlée naïve résumé", "中文字符测试 中文 文字",
          "emoji 😀🎉👍 and more 😀", "numbers 123-456 789-abc {\"key\": [1, 2]}"] * 20
TEXTS = ["the café 中文 😀!", "héllo  wörld\n\tnew line", "👍 résumé 123-abc", "字符 emoji 🎉🎉"]
TINY_TARGET = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny-target"


def train_byte_level(tmp: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=500, special_tokens=["<|endoftext|>", "<|pad|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                 pad_token="<|pad|>", clean_up_tokenization_spaces=False)
    hf.add_tokens([" the", "ab cd"])  # non-special: " the" decodes exactly like "Ġthe"
    hf.save_pretrained(str(tmp))
    return PreTrainedTokenizerFast.from_pretrained(str(tmp), local_files_only=True)


def train_sentencepiece(tmp: Path) -> PreTrainedTokenizerFast:
    """Llama-2 style: '▁' word prefix, `<0xXX>` byte fallback for chars outside the vocab."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, limit_alphabet=40, show_progress=False))  # CJK/emoji left to bytes
    trained = json.loads(tok.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [t for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1])]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    sp = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, merges, unk_token="<unk>",
                              byte_fallback=True, fuse_unk=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    sp.add_special_tokens(specials)
    hf = PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>", bos_token="<s>",
                                 eos_token="</s>", clean_up_tokenization_spaces=False)
    hf.save_pretrained(str(tmp))
    return PreTrainedTokenizerFast.from_pretrained(str(tmp), local_files_only=True)


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> tuple[PreTrainedTokenizerFast, GuidedVocabulary]:
    tok = train_byte_level(tmp_path_factory.mktemp("bytelevel"))
    return tok, build_guided_vocabulary(tok)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory) -> tuple[PreTrainedTokenizerFast, GuidedVocabulary]:
    tok = train_sentencepiece(tmp_path_factory.mktemp("sentencepiece"))
    return tok, build_guided_vocabulary(tok)


def special_ids(tok) -> set[int]:
    return set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}


def decode_each(tok) -> list[str]:
    """Every id decoded alone: one Rust batch call (4k separate tok.decode calls take ~10 s),
    checked against tok.decode on a sample."""
    texts = tok.backend_tokenizer.decode_batch([[i] for i in range(len(tok))],
                                               skip_special_tokens=False)
    for tid in random.Random(0).sample(range(len(tok)), 50):
        assert tok.decode([tid]) == texts[tid]
    return texts


def check_byte_level_round_trip(tok, gv: GuidedVocabulary) -> None:
    assert gv.mode == "byte_level"
    specials = special_ids(tok)
    for tid, text in enumerate(decode_each(tok)):
        b = gv.token_bytes[tid]
        if tid in specials:
            assert b is None
            continue
        # Partial UTF-8 tokens decode to U+FFFD on both sides (Rust from_utf8_lossy vs Python).
        assert text == b.decode("utf-8", "replace"), tid
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(gv.token_bytes[i] for i in ids) == text.encode()


def test_byte_level_round_trip(byte_level):
    tok, gv = byte_level
    check_byte_level_round_trip(tok, gv)
    multi = [b for b in gv.token_bytes if b and any(c >= 0x80 for c in b)]
    assert any(len(b) >= 2 and b.decode("utf-8", "ignore") for b in multi)  # whole chars
    assert any(len(b) == 1 for b in multi)  # lone bytes of a char


def test_default_tokenizer_round_trip():
    tok = PreTrainedTokenizerFast.from_pretrained(str(TINY_TARGET), local_files_only=True)
    check_byte_level_round_trip(tok, load_guided_vocabulary(TINY_TARGET))


def sp_piece_bytes(piece: str) -> bytes:
    """The raw SentencePiece meaning of a piece, written independently of the module."""
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes.fromhex(piece[3:5])
    return piece.replace("▁", " ").encode()


def test_sentencepiece_round_trip(sentencepiece):
    tok, gv = sentencepiece
    assert gv.mode == "sentencepiece"
    specials, decoded = special_ids(tok), decode_each(tok)
    for tid, piece in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        if tid in specials:
            assert gv.token_bytes[tid] is None
            continue
        b = gv.token_bytes[tid]
        assert b == sp_piece_bytes(piece), piece
        # decode() of one token drops its leading space (the Strip decoder), nothing else.
        assert decoded[tid] == b.decode("utf-8", "replace").removeprefix(" "), piece
    used_fallback = False
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        used_fallback |= any(re.fullmatch(r"<0x..>", p) for p in tok.convert_ids_to_tokens(ids))
        assert b"".join(gv.token_bytes[i] for i in ids) == (" " + text).encode()  # prefix '▁'
    assert used_fallback


def test_shared_strings_kept_together(byte_level, sentencepiece):
    tok, gv = byte_level
    ids = gv.vocabulary.get(b" the")
    assert ids == sorted([tok.convert_tokens_to_ids("Ġthe"), tok.convert_tokens_to_ids(" the")])
    assert gv.vocabulary.get(b"ab cd") == [tok.convert_tokens_to_ids("ab cd")]
    tok, gv = sentencepiece
    a_ids = gv.vocabulary.get(b"a")
    assert a_ids == sorted([tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("<0x61>")])


def test_specials_left_out_and_hash_stable(byte_level, sentencepiece):
    tok, gv = byte_level
    assert gv.eos_token_id == tok.eos_token_id
    for name in ("<|endoftext|>", "<|pad|>"):
        assert gv.vocabulary.get(name.encode()) is None
    assert gv.vocab_hash == build_guided_vocabulary(tok).vocab_hash
    assert gv.vocab_hash != build_guided_vocabulary(tok, eos_token_id=1).vocab_hash
    assert gv.vocab_hash != sentencepiece[1].vocab_hash
    assert sentencepiece[1].vocabulary.get(b"</s>") is None


def walk(gv: GuidedVocabulary, index: Index, logits_width: int, rng: random.Random) -> bytes:
    """Sample uniformly from the mask until EOS; check the mask against get_tokens each step."""
    guide, out = Guide(index), b""
    mask = allocate_token_bitmask(2, logits_width)
    for _ in range(300):
        fill_token_bitmask(guide, mask, 1, gv)
        allowed = set(unpack_token_bitmask(mask[1:], logits_width)[0].nonzero().flatten().tolist())
        assert allowed == set(guide.get_tokens())
        assert all(i < len(gv.token_bytes) for i in allowed)  # padded ids never set
        assert (gv.eos_token_id in allowed) == guide.is_finished()
        others = sorted(allowed - {gv.eos_token_id})
        if gv.eos_token_id in allowed and (not others or rng.random() < 0.5):
            return out  # never advance on EOS
        tid = rng.choice(others)
        out += gv.token_bytes[tid]
        guide.advance(tid, return_tokens=False)
    raise AssertionError("guide never reached a final state")


@pytest.mark.parametrize("which", ["byte_level", "sentencepiece"])
def test_guide_walk_masks(which, request):
    tok, gv = request.getfixturevalue(which)
    regex = r"[0-9]{3}-[a-z]+"
    index = Index(regex, gv.vocabulary)
    rng = random.Random(0)
    for _ in range(10):
        assert re.fullmatch(regex, walk(gv, index, len(tok) + 37, rng).decode())


def test_apply_token_bitmask_and_width_checks(byte_level):
    tok, gv = byte_level
    width = len(tok) + 40  # model vocab padded past the tokenizer's
    guide = Guide(Index(r"[0-9]{3}", gv.vocabulary))
    mask = allocate_token_bitmask(2, width)
    fill_token_bitmask(guide, mask, 0, gv)  # row 1 stays all ones: an unguided request
    logits = torch.randn(2, width)
    apply_token_bitmask(logits, mask)
    assert set(logits[0].isfinite().nonzero().flatten().tolist()) == set(guide.get_tokens())
    assert logits[1].isfinite().all()
    assert not logits[0, len(tok):].isfinite().any()
    with pytest.raises(ValueError):
        fill_token_bitmask(guide, allocate_token_bitmask(1, 64), 0, gv)  # narrower than vocab
    with pytest.raises(ValueError):
        apply_token_bitmask(torch.zeros(1, width + 64), mask[:1])
