"""Incremental detokenization: no half characters, stop strings cut exactly."""

from __future__ import annotations

import random

import pytest

from deployments.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """Token id = one byte (256 = an EOS-like special token), decoded like HF byte-level BPE."""

    EOS = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        data = bytes(i for i in ids if i != self.EOS)
        text = data.decode("utf-8", errors="replace")
        return text if skip_special_tokens or self.EOS not in ids else text + "<eos>"


def stream(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    pieces = [detok.add_tokens(c) for c in chunks]
    pieces.append(detok.finish())
    return pieces


def test_multibyte_characters_split_across_tokens_are_never_emitted_in_halves():
    tok = ByteTokenizer()
    text = "héllo 日本語 🙂!"
    detok = IncrementalDetokenizer(tok)
    pieces = stream(detok, [[b] for b in tok.encode(text)])
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # The four bytes of the emoji come out as one piece, once the last byte arrives.
    assert "🙂" in pieces


def test_random_chunking_gives_the_full_decode():
    tok = ByteTokenizer()
    text = "ünïcödé — 中文 text with emoji 🙂🎉 and ascii"
    ids = tok.encode(text)
    rng = random.Random(0)
    for _ in range(20):
        chunks, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            chunks.append(ids[i:i + n])
            i += n
        pieces = stream(IncrementalDetokenizer(tok), chunks)
        assert "".join(pieces) == text
        assert all("\ufffd" not in p for p in pieces)


def test_an_incomplete_character_at_the_end_is_flushed_as_decoded():
    tok = ByteTokenizer()
    ids = tok.encode("ab") + list("€".encode())[:2]  # the request ended mid-character
    detok = IncrementalDetokenizer(tok)
    assert detok.add_tokens(ids) == "ab"
    assert detok.finish() == tok.decode(ids)[2:]


def test_special_tokens_are_skipped():
    tok = ByteTokenizer()
    pieces = stream(IncrementalDetokenizer(tok), [tok.encode("hi"), [ByteTokenizer.EOS]])
    assert "".join(pieces) == "hi"


@pytest.mark.parametrize("chunk", [1, 2, 3, 100])
def test_stop_string_across_token_boundaries_is_cut_exactly(chunk):
    tok = ByteTokenizer()
    ids = tok.encode("Hello wor" + "ld STOP and more")
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    detok = IncrementalDetokenizer(tok, stop=["STOP"])
    pieces = []
    for c in chunks:
        pieces.append(detok.add_tokens(c))
        assert "S" not in "".join(pieces)  # nothing of the stop string ever leaves
        if detok.stopped:
            break
    pieces.append(detok.finish())
    assert detok.stopped and detok.stop_reason == "STOP"
    assert "".join(pieces) == "Hello world "


def test_text_that_only_looks_like_a_stop_string_is_released():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=["</end>"])
    assert detok.add_tokens(tok.encode("a </e")) == "a "  # "</e" might start the stop string
    assert detok.add_tokens(tok.encode("x")) == "</ex"  # it did not
    assert detok.add_tokens(tok.encode(" <")) == " "
    assert detok.finish() == "<"  # the request ended: what was held goes out
    assert not detok.stopped


def test_the_first_stop_string_completed_wins_and_then_the_earliest_start():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=["bcde", "cd"])
    out = detok.add_tokens(tok.encode("abcdef")) + detok.finish()
    assert out == "ab" and detok.stop_reason == "cd"  # "cd" is complete one token earlier
    detok = IncrementalDetokenizer(tok, stop=["cd", "bcd"])
    out = detok.add_tokens(tok.encode("abcdef")) + detok.finish()
    assert out == "a" and detok.stop_reason == "bcd"  # both end at "d": the earlier start


def test_stop_string_with_multibyte_characters():
    tok = ByteTokenizer()
    ids = tok.encode("x 日本語 y")
    detok = IncrementalDetokenizer(tok, stop=["本語"])
    pieces = [detok.add_tokens([b]) for b in ids]
    pieces.append(detok.finish())
    assert "".join(pieces) == "x 日" and all("\ufffd" not in p for p in pieces)


def test_nothing_after_a_stop():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=["."])
    assert detok.add_tokens(tok.encode("one. two")) == "one"
    assert detok.add_tokens(tok.encode(" three")) == ""
    assert detok.finish() == ""


def test_hugging_face_byte_level_tokenizer_with_prompt_context():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|eos|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["plain ascii words only, nothing else"] * 10, trainer)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|eos|>")
    prompt = tok.encode("prompt words")
    text = " words ünïcödé 日本語 🙂 STOP after"
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # non-ASCII characters span several tokens
    detok = IncrementalDetokenizer(tok, prompt_token_ids=prompt, stop=["STOP"])
    pieces = [detok.add_tokens([i]) for i in ids + [tok.eos_token_id]]
    pieces.append(detok.finish())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == " words ünïcödé 日本語 🙂 "


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_no_stop_string_counts_that_ends_inside_the_first_min_tokens(chunk):
    """vLLM's rule: stop strings are looked for once more than `min_tokens` tokens are out, and
    only where they end after those tokens' text."""
    tok = ByteTokenizer()
    ids = tok.encode("a.b.c.d")  # one byte a token: "." ends tokens 2, 4 and 6
    chunks = [ids[i:i + chunk] for i in range(0, len(ids), chunk)]
    for min_tokens, expected in [(0, "a"), (1, "a"), (2, "a.b"), (4, "a.b.c"), (6, "a.b.c.d")]:
        detok = IncrementalDetokenizer(tok, stop=["."], min_tokens=min_tokens)
        assert "".join(stream(detok, chunks)) == expected, min_tokens
        assert detok.stopped == (min_tokens < 6)
    # A stop string that began inside them but ends after them counts.
    detok = IncrementalDetokenizer(tok, stop=["b.c"], min_tokens=2)
    assert "".join(stream(detok, chunks)) == "a." and detok.stop_reason == "b.c"


def test_include_stop_keeps_the_stop_string_and_the_stop_tokens_text():
    """vLLM's `include_stop_str_in_output`; without it the stop token that ended the output
    (a special one too, when special tokens are written) leaves its text out, as in vLLM."""
    tok = ByteTokenizer()
    for include, expected in [(False, "Hello "), (True, "Hello STOP")]:
        detok = IncrementalDetokenizer(tok, stop=["STOP"], include_stop=include)
        assert "".join(stream(detok, [tok.encode("Hello ST"), tok.encode("OP and more")])) == expected
    ended = [tok.encode("a"), tok.encode("b.")]
    for include, expected in [(False, "ab"), (True, "ab.")]:
        detok = IncrementalDetokenizer(tok, include_stop=include, stop_token_ids={ord(".")})
        assert "".join(stream(detok, ended)) == expected
    for include, expected in [(False, "ab"), (True, "ab<eos>")]:
        detok = IncrementalDetokenizer(tok, skip_special_tokens=False, include_stop=include,
                                       stop_token_ids={tok.EOS})
        assert "".join(stream(detok, [tok.encode("ab") + [tok.EOS]])) == expected
    detok = IncrementalDetokenizer(tok, stop=["b"], stop_token_ids={ord(".")}).fresh()
    assert "".join(stream(detok, ended)) == "a"  # a fresh one keeps the settings
