"""Markup tokens: the special tokens of a tokenizer that spell the markers the app reads in its
model's text, the tool-call markers and, with a reasoning parser, the reasoning tags.

Some tokenizers hold the markers as special tokens: Mistral's `[TOOL_CALLS]`, Hermes-2-Pro's
`<tool_call>`, Kimi's `<|tool_calls_section_begin|>`, a thinking model's `<think>`. As special
tokens they would be out of every guided format's vocabulary, so the call grammar would make the
model spell a marker out of plain tokens, which it was never trained to do, and out of the text
under `skip_special_tokens`, so the calls (or the reasoning's end) it wrote would not be read
(vLLM's hermes and mistral parsers turn `skip_special_tokens` off for this). Here they are text,
as a plain token is: formats may write them (app/guided/vocabulary.py) and the detokenizer writes
them out, while the other special tokens (EOS, the template's turn markers) are still left out.
"""

from __future__ import annotations

from typing import Any, Sequence

from app.guided.vocabulary import unwritten_special_ids


def markup_tokens(tokenizer: Any, markers: Sequence[str]) -> tuple[str, ...]:
    """The texts of the special tokens that spell all or part of one of `markers`; never one the
    tokenizer names for another job (EOS, BOS, padding, unknown)."""
    named = {tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token, tokenizer.unk_token}
    return tuple(sorted({t.content for t in tokenizer.added_tokens_decoder.values()
                         if t.special and t.content and t.content not in named
                         and any(t.content in marker for marker in markers)}))


def skipped_special_ids(tokenizer: Any, markup: tuple[str, ...]) -> frozenset[int] | None:
    """The special tokens `skip_special_tokens` leaves out of the text: all but the markup tokens
    (None where there are none: the tokenizer's own skip)."""
    return unwritten_special_ids(tokenizer, markup) if markup else None
