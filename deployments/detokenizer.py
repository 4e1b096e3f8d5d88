"""Incremental detokenization for streaming: text comes out as tokens arrive, but never half a
UTF-8 character, and never any part of a stop string.

Two hold-backs, in this order:

1. Bytes. A byte-level tokenizer can split one character across tokens; decoding the first
   part alone gives U+FFFD. Text that ends in U+FFFD is held until the next token completes it
   (vLLM's prefix/read offsets: decode a short window, emit only what it added).
2. Stop strings. Text that could be the start of a stop string is held until the next tokens
   show whether it is one. When a stop string appears the text is cut just before it, the stop
   string itself is not emitted (with `include_stop`, vLLM's `include_stop_str_in_output`, the
   text is cut just after it), and `stopped` is set: the caller ends the request. While
   the first `min_tokens` tokens come out no stop string is looked for, and one that ends
   inside their text never counts (vLLM's rule).

At the end of a request `finish()` flushes what is still held (a stop string can no longer
complete, and an incomplete character is emitted as the tokenizer decodes it).
"""

from __future__ import annotations

from typing import Collection, Protocol, Sequence

# Tokens of the prompt decoded with the first output tokens, so that tokenizers whose decoding
# depends on the previous token (SentencePiece's leading space) decode the first output right.
_PROMPT_CONTEXT_TOKENS = 5


class Tokenizer(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int] = (),
                 stop: Sequence[str] = (), skip_special_tokens: bool = True, min_tokens: int = 0,
                 include_stop: bool = False, stop_token_ids: Collection[int] = frozenset(),
                 skipped_special_ids: frozenset[int] | None = None):
        """`stop_token_ids`: the tokens that end the request (its own, and the model's EOS unless
        it ignores EOS). As in vLLM, the one that ends it is not written out, nor is a stop
        string, unless `include_stop` (vLLM's `include_stop_str_in_output`). With
        `skip_special_tokens`, `skipped_special_ids` are the special tokens left out (all but the
        app's markup tokens, deployments/markup_tokens.py; None: all of them)."""
        self.tokenizer = tokenizer
        self.include_stop = include_stop
        self.unwritten_token_ids = frozenset() if include_stop else frozenset(stop_token_ids)
        self.skip_special_tokens = skip_special_tokens
        self.skipped_special_ids = skipped_special_ids
        if skip_special_tokens and skipped_special_ids is not None:
            self._decode = self._decode_keeping_markup
        self.stop = [s for s in stop if s]
        self._max_stop = max((len(s) for s in self.stop), default=0)
        self.min_tokens = min_tokens
        self._num_tokens = 0  # output tokens fed so far
        self._stop_floor = 0  # a stop string must end after this much text (the first min_tokens' text)
        self._context = tuple(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._ids: list[int] = list(self._context)
        self._prefix_offset = 0
        self._read_offset = len(self._context)
        self.text = ""  # all output text decoded so far (cut at the stop string once stopped)
        self._emitted = 0  # how much of `self.text` has been handed out
        self.stopped = False  # a stop string was found; the request should end
        self.stop_reason: str | None = None  # which stop string

    def fresh(self) -> "IncrementalDetokenizer":
        """A new detokenizer like this one was at the start: for another text of the same
        request (one beam of a beam search)."""
        return IncrementalDetokenizer(self.tokenizer, self._context, self.stop, self.skip_special_tokens,
                                      self.min_tokens, self.include_stop, self.unwritten_token_ids,
                                      self.skipped_special_ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_keeping_markup(self, ids: Sequence[int]) -> str:
        skipped = self.skipped_special_ids
        return self.tokenizer.decode([i for i in ids if i not in skipped], skip_special_tokens=False)

    def _decode_new(self) -> str:
        """Text the tokens since the last read add, or "" while it ends in half a character."""
        prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full = self._decode(self._ids[self._prefix_offset:])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return full[len(prefix):]
        return ""

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """Feed new output tokens; returns the text that may be sent now (possibly "")."""
        if self.stopped:
            return ""
        for token_id in token_ids:  # token by token: a stop string ends at the earliest token
            if token_id in self.unwritten_token_ids:  # it ended the request: the last one
                break
            self._ids.append(token_id)
            self._num_tokens += 1
            self.text += self._decode_new()
            if self._num_tokens <= self.min_tokens:
                self._stop_floor = len(self.text)
            elif self._find_stop():
                break
        return self._take(final=False)

    def finish(self) -> str:
        """The request ended: returns everything still held back."""
        if not self.stopped and self._read_offset < len(self._ids):
            prefix = self._decode(self._ids[self._prefix_offset:self._read_offset])
            full = self._decode(self._ids[self._prefix_offset:])
            self.text += full[len(prefix):]
            self._prefix_offset = self._read_offset = len(self._ids)
            self._find_stop()
        return self._take(final=True)

    def _find_stop(self) -> bool:
        if not self.stop or self._num_tokens <= self.min_tokens:
            return False
        # Only where a stop string could newly end: not inside text already handed out, nor
        # inside the first min_tokens' text.
        start = max(0, self._emitted - self._max_stop + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, max(start, self._stop_floor - len(s) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return False
        self.text = self.text[:best[0] + (len(best[1]) if self.include_stop else 0)]
        self.stopped, self.stop_reason = True, best[1]
        return True

    def _take(self, final: bool) -> str:
        end = len(self.text)
        if not final and not self.stopped:
            end -= self._stop_prefix_len()
        end = max(end, self._emitted)
        out = self.text[self._emitted:end]
        self._emitted = end
        return out

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that is the start of a stop string."""
        tail = self.text[-self._max_stop:] if self._max_stop else ""
        for n in range(len(tail), 0, -1):
            if any(s.startswith(tail[-n:]) for s in self.stop):
                return n
        return 0
