"""The sessions workload's live prefix set: what says whether a prefix-routing run sits in the
issue-20 setting (more than one KV pool, less than two)."""

from __future__ import annotations

from benchmarks.serving_sessions import live_prefix_blocks


class OneTokenPerChar:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_a_block_is_live_between_its_first_and_last_use():
    system, other = "s" * 8, "o" * 8
    sent = [(0.0, system + "a" * 4), (1.0, other + "b" * 4), (2.0, system + "a" * 4 + "c" * 4),
            (3.0, other + "d" * 4)]
    # Blocks of 4: each system prompt's 2 blocks are reused, and so is the first turn's own block
    # "aaaa" after "s" * 8; "bbbb", "cccc" and "dddd" are used once.
    live = live_prefix_blocks(sent, OneTokenPerChar(), block_size=4)
    # At t = 1 (the middle fifths of 4 sends are t = 0 .. 2): system (2) + its "aaaa" (1) live,
    # and "other" (2) from t = 1 on; at t = 2 only "other" is still to be used again.
    assert live == {"mean": (3 + 5 + 2) / 3, "peak": 5.0}


def test_prompts_used_once_leave_nothing_live():
    sent = [(float(t), chr(ord("a") + t) * 16) for t in range(5)]
    assert live_prefix_blocks(sent, OneTokenPerChar(), block_size=4) == {"mean": 0.0, "peak": 0.0}
