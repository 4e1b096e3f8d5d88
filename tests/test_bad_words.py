"""vLLM's `bad_words` tokenized as vLLM does: the word as it starts the text, and as it follows
a space where the tokenizer writes that space into the word's first token."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from deployments.bad_words import bad_words_token_ids
from tests.checkpoints import DEFAULT_TARGET


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_TARGET)


def test_a_word_bars_its_plain_and_its_spaced_tokens(tokenizer):
    plain = tokenizer.encode("return", add_special_tokens=False)
    spaced = tokenizer.encode(" return", add_special_tokens=False)
    assert spaced != plain and len(spaced) == len(plain)  # the shipped BPE writes the space into the token
    assert bad_words_token_ids(tokenizer, ["return", "  return"]) == [plain, spaced, plain, spaced]


def test_a_spaced_form_of_another_length_is_left_out_as_vllm_leaves_it(tokenizer):
    plain = tokenizer.encode("EOF", add_special_tokens=False)
    assert len(tokenizer.encode(" EOF", add_special_tokens=False)) != len(plain)
    assert bad_words_token_ids(tokenizer, ["EOF"]) == [plain]
