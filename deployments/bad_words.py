"""vLLM's `bad_words` as the token sequences the engine bars (app/engine/selection/penalties.py).

A word is tokenized as it would start the text and, where the tokenizer writes a leading space
into the token (byte-level BPE's "Ġ", SentencePiece's "▁"), as it would follow a space: vLLM's
rule keeps the second form when it is as long as the first and starts with another token.
"""

from __future__ import annotations


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    sequences: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        sequences.append(plain)
        if len(spaced) == len(plain) and spaced[0] != plain[0]:
            sequences.append(spaced)
    return [s for s in sequences if s]
