"""Prompt-lookup (n-gram) proposer: no model, just the request's own tokens.

Input-grounded work (summaries, code edits, document QA) keeps copying spans of the prompt;
when the last n tokens occurred earlier, the tokens that followed them are a good guess.
Longer n is tried first (a longer match is a better predictor), and the most recent
occurrence wins (it is the likeliest continuation of what is being copied now).

With `recent_output_tokens`, a request whose own tokens hold no match looks its last tokens up
in the outputs of the requests that finished last (`recent_outputs`, fed by the Speculator as
requests end; app/engine/spec/recent_outputs.py).

The search is vectorised with numpy: one comparison over the whole context finds where the
last token occurred before, and only those places are extended to longer n, so an 8k token
context costs microseconds. Converting a long Python list to an array costs
more than the search, so `propose_for` keeps one growing array per request.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from app.engine.spec.proposal import DraftInput, Proposal
from app.engine.spec.recent_outputs import RecentOutputs


def longest_match_ends(haystack: np.ndarray, key: np.ndarray, min_n: int, max_n: int) -> np.ndarray:
    """The ends e, ascending, of the occurrences in `haystack` of key's last n tokens, for the largest
    n in [min_n, max_n] that has one, each with a token after it (e <= len(haystack) - 2); empty
    when none has. `key` is not empty.

    The occurrences of key's last token are found in one pass, then only those are extended one
    token back at a time: most steps of most workloads have none, and stop there."""
    length = len(key)
    ends = np.flatnonzero(haystack[:len(haystack) - 1] == key[length - 1])
    longest = None
    for n in range(1, min(max_n, length) + 1):
        if n > 1:  # those ends whose match also holds n - 1 tokens further back
            ends = ends[ends >= n - 1]
            ends = ends[haystack[ends - (n - 1)] == key[length - n]]
        if not ends.size:
            break
        if n >= min_n:
            longest = ends
    return ends[:0] if longest is None else longest


def find_ngram_continuation(tokens: np.ndarray, k: int, min_n: int = 1, max_n: int = 4
                            ) -> np.ndarray:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens,
    for the largest n in [min_n, max_n] that has one; empty when none matches.

    An occurrence may overlap the suffix itself (periodic text); the proposal is cut where the
    sequence ends."""
    if k <= 0 or len(tokens) < min_n + 1:
        return tokens[:0]
    ends = longest_match_ends(tokens, tokens, min_n, max_n)
    return tokens[ends[-1] + 1:ends[-1] + 1 + k] if ends.size else tokens[:0]


class NgramProposer:
    """Proposes up to k tokens per request by prompt lookup, with n from max_n down to min_n."""

    reads_sequences = False  # a lookup in the request's own tokens: nothing to catch up on

    def __init__(self, k: int = 4, min_n: int = 1, max_n: int = 4, recent_output_tokens: int = 0):
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.k, self.min_n, self.max_n = k, min_n, max_n
        self.recent_outputs = (RecentOutputs(recent_output_tokens, k, min_n, max_n)
                               if recent_output_tokens > 0 else None)
        self._buffers: dict[str, tuple[np.ndarray, int]] = {}  # request id -> (array, length)

    def propose_for(self, request_id: str, token_ids: Sequence[int], k: int | None = None
                    ) -> list[int]:
        """The proposal for this request's tokens (prompt + output so far), converting only
        the tokens added since its last call (token lists only grow; a shorter or changed list
        is converted afresh)."""
        length = len(token_ids)
        buf, known = self._buffers.get(request_id, (np.empty(0, dtype=np.int64), 0))
        if known > length or (known and buf[known - 1] != token_ids[known - 1]):
            known = 0
        if length > len(buf):
            grown = np.empty(max(length, 2 * len(buf), 64), dtype=np.int64)
            grown[:known] = buf[:known]
            buf = grown
        if length > known:
            buf[known:length] = token_ids[known:length]
        self._buffers[request_id] = (buf, length)
        return self._search(buf[:length], k)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's buffer."""
        self._buffers.pop(request_id, None)

    def _search(self, tokens: np.ndarray, k: int | None) -> list[int]:
        k = self.k if k is None else k
        found = find_ngram_continuation(tokens, k, self.min_n, self.max_n).tolist()
        if not found and k > 0 and self.recent_outputs is not None:
            found = self.recent_outputs.lookup(tokens[-self.max_n:].tolist(), k)
        return found

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        """The engine's proposer interface: point-mass proposals (no distribution)."""
        return [Proposal(self.propose_for(inp.request_id, inp.token_ids, inp.k)) for inp in inputs]
