"""n-gram lookup beyond a request's own tokens: the outputs of the requests that finished last.

Outputs repeat across requests more than prompt lookup can see: agent loops, JSON and tool-call
scaffolding, boilerplate code, and a model's own habits. SGLang's n-gram speculation searches a
trie over all requests' tokens and vLLM's suffix decoding a tree over past responses; this is
the small form of both. When a request's last n tokens (longest n first) ended somewhere in a
recent output, the tokens that followed there are its drafts. Its own tokens are searched
first (`NgramProposer`): they are the better guess. Verification keeps every token exact.

The table maps each n-gram of a kept output (n in [min_n, max_n], the proposer's) to at most k
tokens that followed its latest occurrence. It is bounded: past `capacity_tokens` output
tokens' worth of entries, the least recently written go first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class RecentOutputs:
    def __init__(self, capacity_tokens: int, k: int, min_n: int, max_n: int):
        if capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens must be positive, got {capacity_tokens}")
        self.k, self.min_n, self.max_n = k, min_n, max_n
        self.max_entries = capacity_tokens * (max_n - min_n + 1)
        self.followers: OrderedDict[tuple[int, ...], tuple[int, ...]] = OrderedDict()
        self.num_found = 0  # lookups that found drafts

    def __len__(self) -> int:
        return len(self.followers)

    def add(self, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        """A finished request's tokens: its output (after `num_prompt_tokens`) is kept, keyed
        also by the n-grams that end in the prompt's last tokens."""
        start = max(num_prompt_tokens - self.max_n, 0)
        tokens = list(token_ids[start:])
        first_follower = num_prompt_tokens - start  # index in `tokens` of the first output token
        followers = self.followers
        for j in range(first_follower, len(tokens)):
            follow = tuple(tokens[j:j + self.k])
            for n in range(self.min_n, min(self.max_n, j) + 1):
                key = tuple(tokens[j - n:j])
                followers[key] = follow
                followers.move_to_end(key)
        while len(followers) > self.max_entries:
            followers.popitem(last=False)

    def lookup(self, last_tokens: Sequence[int], k: int) -> list[int]:
        """At most k tokens that followed the longest n-gram ending `last_tokens` (which holds
        at least the request's last `max_n` tokens) in a recent output; empty when none did."""
        for n in range(min(self.max_n, len(last_tokens)), self.min_n - 1, -1):
            follow = self.followers.get(tuple(last_tokens[len(last_tokens) - n:]))
            if follow:
                self.num_found += 1
                return list(follow[:k])
        return []
