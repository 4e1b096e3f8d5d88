"""One guided request's position in its format: masks, advancing, rollback, jump-forward.

A `GuidedDecoder` wraps an outlines-core `Guide` over a compiled `Index` and is what the target
engine holds per guided request. Every call is local and cheap (no RPC): writing a mask row is
one Rust call (~5 us for 4k ids).

EOS is handled here, never by the guide (outlines-core raises when advanced on EOS): it is
allowed only in a final state, accepting it is recorded as a token that did not move the guide,
and nothing is allowed after it. `rollback(n)` undoes the last n accepted tokens, EOS included,
so an engine can count tokens without caring which of them were EOS.

Speculation: `fill_draft_bitmasks` writes the mask of each of the 1+k verified positions by
walking the guide along the drafts and rolling it back; rows after the first draft the guide
rejects (or after an accepted EOS) are all zeros. Those positions are never used: the target
cannot accept a draft its own mask forbids, so verification stops at or before that row.

Jump-forward (`forced_token_ids`): see its docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from outlines_core import Guide, Index

from app.guided.vocabulary import GuidedVocabulary, allow_only_token, fill_token_bitmask

MAX_FORCED_BYTES = 512
MAX_FORCED_TOKENS = 32  # forced + proposed drafts must stay within the guide's max_rollback


class _ByteTables:
    """Per vocabulary: first byte of every token, and one id for each single-byte string."""

    _by_hash: dict[str, "_ByteTables"] = {}

    def __init__(self, vocab: GuidedVocabulary):
        self.first_byte = [b[0] if b else -1 for b in vocab.token_bytes]
        self.byte_token: dict[int, int] = {}
        for tid, b in enumerate(vocab.token_bytes):
            if b is not None and len(b) == 1 and b[0] not in self.byte_token:
                self.byte_token[b[0]] = tid

    @classmethod
    def of(cls, vocab: GuidedVocabulary) -> "_ByteTables":
        tables = cls._by_hash.get(vocab.vocab_hash)
        if tables is None:
            tables = cls._by_hash[vocab.vocab_hash] = cls(vocab)
        return tables


def forced_bytes(index: Index, vocab: GuidedVocabulary, state: int,
                 limit: int = MAX_FORCED_BYTES) -> tuple[bytes, int]:
    """The bytes every continuation from `state` starts with, and the state after them.

    A byte is forced when the state is not final and every allowed token starts with that same
    byte; the walk then moves on through the single-byte token for it (it stops where the
    vocabulary has none)."""
    tables = _ByteTables.of(vocab)
    out = bytearray()
    while len(out) < limit and not index.is_final_state(state):
        first = -1
        for tid in index.get_allowed_tokens(state) or ():
            fb = tables.first_byte[tid] if tid < len(tables.first_byte) else -1
            if fb < 0 or (first >= 0 and fb != first):
                first = -2
                break
            first = fb
        tid = tables.byte_token.get(first)
        nxt = index.get_next_state(state, tid) if tid is not None else None
        if nxt is None:
            break
        out.append(first)
        state = nxt
    return bytes(out), state


def _utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is whole UTF-8 characters (a forced run can end inside
    one when two alternatives share leading bytes)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class GuidedDecoder:
    """Per-request guide state. `memo` is shared by all decoders of one index and one tokenizer
    (the engine's core loop keeps one per compiled format): it caches forced tokens and
    terminal states per automaton state. `max_rollback` bounds the drafts (forced tokens
    included) one `fill_draft_bitmasks` or `rollback` can walk back over."""

    def __init__(self, index: Index, vocab: GuidedVocabulary, logits_width: int,
                 max_rollback: int = 64, memo: dict | None = None):
        if logits_width < vocab.id_bound:
            raise ValueError(f"logits width {logits_width} is smaller than the vocabulary "
                             f"({vocab.id_bound} ids)")
        self.index, self.vocab, self.logits_width = index, vocab, logits_width
        self.guide = Guide(index, max_rollback=max_rollback)
        self.memo = memo if memo is not None else {}
        self._advanced: list[bool] = []  # per accepted token: moved the guide (False: EOS)
        self._eos_accepted = False

    # -- state ------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """Tokens accepted so far (EOS included)."""
        return len(self._advanced)

    @property
    def is_finished(self) -> bool:
        """EOS was accepted, or nothing but EOS can follow: the request is done ("stop")."""
        return self._eos_accepted or self._is_terminal(self.guide.get_state())

    def _is_terminal(self, state: int) -> bool:
        key = ("terminal", state)
        terminal = self.memo.get(key)
        if terminal is None:
            terminal = self.memo[key] = bool(
                self.index.is_final_state(state)
                and all(t == self.vocab.eos_token_id for t in self.index.get_allowed_tokens(state)))
        return terminal

    def allows(self, token_id: int) -> bool:
        if self._eos_accepted:
            return False
        if token_id == self.vocab.eos_token_id:
            return self.guide.is_finished()
        return self.index.get_next_state(self.guide.get_state(), token_id) is not None

    # -- masks ------------------------------------------------------------------------------
    def fill_bitmask(self, bitmask: torch.Tensor, row: int, jump_forward_tokenizer: Any = None) -> None:
        """Write the allowed ids into `bitmask[row]` (see vocabulary.allocate_token_bitmask).

        With jump-forward (its tokenizer given), a state whose format forces text allows only
        the first forced token, the one jump-forward would insert: so the output does not
        depend on whether a step boundary (speculation, batching) falls at that state.

        After an EOS (the row after an EOS draft, verified in the same pass), EOS alone: the row is
        never used, since the output ends at the EOS, but every row needs a finite logit (the
        CPU's draws refuse a row without one)."""
        if self._eos_accepted:
            allow_only_token(bitmask, row, self.vocab.eos_token_id)
            return
        forced = self.forced_token_ids(jump_forward_tokenizer) if jump_forward_tokenizer is not None else []
        if forced:
            allow_only_token(bitmask, row, forced[0])
        else:
            fill_token_bitmask(self.guide, bitmask, row, self.vocab)

    # -- moving -----------------------------------------------------------------------------
    def advance(self, token_id: int) -> bool:
        """Accept one token; False (and no change) if the format does not allow it."""
        if not self.allows(token_id):
            return False
        if token_id == self.vocab.eos_token_id:
            self._eos_accepted = True
            self._advanced.append(False)
        else:
            self.guide.advance(token_id, return_tokens=False)
            self._advanced.append(True)
        return True

    def accept_prefix(self, token_ids: list[int]) -> int:
        """Advance through `token_ids` while allowed; how many were accepted."""
        n = 0
        for tid in token_ids:
            if not self.advance(tid):
                break
            n += 1
        return n

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens (at most `max_rollback` guide moves back)."""
        if n < 0 or n > len(self._advanced):
            raise ValueError(f"cannot roll back {n} of {len(self._advanced)} tokens")
        if n == 0:
            return
        undone = self._advanced[-n:]
        del self._advanced[-n:]
        moves = sum(undone)
        if moves:
            self.guide.rollback_state(moves)
        if not all(undone):
            self._eos_accepted = False

    # -- speculation ------------------------------------------------------------------------
    def fill_draft_bitmasks(self, bitmask: torch.Tensor, row: int, draft_ids: list[int],
                            jump_forward_tokenizer: Any = None) -> int:
        """Write the masks of the 1+k verified positions into rows row .. row+k: row+i is the
        mask after the first i drafts. Returns how many drafts the guide accepts (a); rows past
        row+a, never used (verification stops at the first refused draft), allow EOS alone, as
        a row after an EOS does. The guide is left where it was."""
        self.fill_bitmask(bitmask, row, jump_forward_tokenizer)
        accepted = 0
        for i, tid in enumerate(draft_ids):
            if not self.advance(tid):
                break
            accepted += 1
            self.fill_bitmask(bitmask, row + 1 + i, jump_forward_tokenizer)
        for after_refused in range(row + 1 + accepted, row + 1 + len(draft_ids)):
            allow_only_token(bitmask, after_refused, self.vocab.eos_token_id)
        self.rollback(accepted)
        return accepted

    # -- jump-forward -----------------------------------------------------------------------
    def forced_token_ids(self, tokenizer: Any) -> list[int]:
        """Tokens the format forces from here, to be fed as always-accepted draft tokens.

        The forced string is found on bytes, not tokens (`forced_bytes`): with BPE, a forced
        key like `"name"` is reachable through many tokenizations, so no single token is ever
        forced. It is cut to whole UTF-8 characters and tokenized canonically on its own
        (`tokenizer.encode`, no special tokens). Boundaries:
        - left: the forced text is tokenized without the text before it; tokens already
          generated are never re-split, so the split at the join may differ from the canonical
          tokenization of the whole output (harmless for the format, as it is for vLLM/SGLang);
        - right: the last token is dropped when the format allows, in its place, a longer token
          that starts with it: it could merge with the text that follows (`"` + `Bob` ->
          `"Bob`), which the model should choose. A last token nothing can extend (`}` at the
          end, `":` before a space-free number) is kept;
        - tokens are taken only while their bytes spell the forced text and the guide accepts
          them (a tokenizer that prepends a space, SentencePiece-style, yields none).
        The guide is not moved; the caller advances it when the tokens are accepted. Cached per
        automaton state in `memo`, so it costs a dict lookup after the first request."""
        if self._eos_accepted:
            return []
        state = self.guide.get_state()
        key = ("forced", state)
        forced = self.memo.get(key)
        if forced is None:
            forced = self.memo[key] = self._forced_from(state, tokenizer)
        return list(forced)

    def _forced_from(self, state: int, tokenizer: Any) -> tuple[int, ...]:
        data, _ = forced_bytes(self.index, self.vocab, state)
        text = _utf8_prefix(data)
        if not text:
            return ()
        encoded = text.encode()
        ids, pos, before_last = [], 0, state
        for tid in tokenizer.encode(text, add_special_tokens=False)[:MAX_FORCED_TOKENS]:
            b = self.vocab.token_bytes[tid] if tid < len(self.vocab.token_bytes) else None
            nxt = self.index.get_next_state(state, tid) if b else None
            if nxt is None or not encoded.startswith(b, pos):
                break
            ids.append(tid)
            before_last, state, pos = state, nxt, pos + len(b)
        if ids and self._extendable(before_last, self.vocab.token_bytes[ids[-1]]):
            ids.pop()
        return tuple(ids)

    def _extendable(self, state: int, prefix: bytes) -> bool:
        """Some token allowed at `state` is longer than `prefix` and starts with it."""
        token_bytes = self.vocab.token_bytes
        for tid in self.index.get_allowed_tokens(state) or ():
            b = token_bytes[tid] if tid < len(token_bytes) else None
            if b is not None and len(b) > len(prefix) and b.startswith(prefix):
                return True
        return False


@dataclass
class CompiledFormat:
    """An output format compiled for an engine: its index, the vocabulary it was built over, and
    the memo its decoders share (the engine's core loop keeps one per `OutputFormat`)."""
    index: Index
    vocab: GuidedVocabulary
    memo: dict = field(default_factory=dict)

    def decoder(self, logits_width: int, max_rollback: int = 64) -> GuidedDecoder:
        """A fresh per-request guide over this format."""
        return GuidedDecoder(self.index, self.vocab, logits_width, max_rollback, self.memo)
