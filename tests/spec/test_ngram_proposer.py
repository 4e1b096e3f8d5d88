"""n-gram prompt lookup: longest n first, most recent match, at most k tokens, cut at the end
of the sequence, none without a match; equal to a brute-force search; fast on 8k tokens."""

import random
import time

import numpy as np
import pytest

from app.config import EngineConfig
from app.engine.spec.ngram_proposer import NgramProposer, find_ngram_continuation
from app.engine.spec.proposal import build_proposer


def brute_force(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        for end in range(length - 2, n - 2, -1):
            if tokens[end - n + 1:end + 1] == tokens[length - n:]:
                return tokens[end + 1:end + 1 + k]
    return []


def test_most_recent_match_wins():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    assert NgramProposer(k=2).propose_for("r", tokens) == [7, 5]


def test_longer_n_preferred_over_more_recent_shorter_match():
    tokens = [5, 6, 7, 8, 9, 6, 1, 5, 6]  # [5, 6] matches at 0; [6] alone more recently at 5
    assert NgramProposer(k=2).propose_for("r", tokens) == [7, 8]
    assert NgramProposer(k=2, max_n=1).propose_for("r", tokens) == [1, 5]


def test_at_most_k_tokens():
    tokens = list(range(20)) + [3, 4]
    assert NgramProposer(k=3).propose_for("r", tokens) == [5, 6, 7]
    assert NgramProposer(k=3).propose_for("r", tokens, k=5) == [5, 6, 7, 8, 9]
    assert NgramProposer(k=3).propose_for("r", tokens, k=0) == []


def test_none_without_a_match():
    assert NgramProposer().propose_for("r", [1, 2, 3, 4]) == []
    assert NgramProposer().propose_for("r", []) == []
    assert NgramProposer().propose_for("r", [5]) == []
    # Only a 1-gram matches; with min_n = 2 that is not enough.
    assert NgramProposer(min_n=2).propose_for("r", [4, 8, 1, 2, 8]) == []
    assert NgramProposer(min_n=1).propose_for("r", [4, 8, 1, 2, 8]) == [1, 2, 8]


def test_match_running_into_the_end_of_the_sequence():
    assert NgramProposer(k=5).propose_for("r", [1, 2, 3, 1, 2]) == [3, 1, 2]
    assert NgramProposer(k=4).propose_for("r", [7, 7, 7, 7]) == [7]  # 3-gram ending at 2, overlapping
    assert NgramProposer(k=4).propose_for("r", [3, 4, 3, 4, 3, 4]) == [3, 4]


def test_matches_brute_force_on_random_sequences():
    rng = random.Random(0)
    for trial in range(400):
        vocab = rng.choice([2, 3, 5, 20])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        k, min_n = rng.randrange(0, 6), rng.randrange(1, 4)
        max_n = rng.randrange(min_n, 6)
        got = find_ngram_continuation(np.array(tokens, dtype=np.int64), k, min_n, max_n).tolist()
        assert got == brute_force(tokens, k, min_n, max_n), (tokens, k, min_n, max_n)


def test_incremental_buffers_agree_with_stateless_search():
    proposer = NgramProposer(k=3)
    rng = random.Random(1)
    tokens = [rng.randrange(4) for _ in range(10)]
    for _ in range(100):  # tokens only grow, as a request's do
        stateless = find_ngram_continuation(np.array(tokens, dtype=np.int64), 3, 1, 4).tolist()
        assert proposer.propose_for("a", tokens) == stateless
        tokens.append(rng.randrange(4))
    other = [9, 8, 9]  # a different list under the same id is converted afresh
    assert proposer.propose_for("a", other) == [8, 9]
    assert proposer.propose_for("a", [1, 2, 1]) == [2, 1]  # same length, changed content
    proposer.forget("a")
    proposer.forget("missing")
    assert proposer.propose_for("a", [1, 2, 1]) == [2, 1]


@pytest.mark.parametrize("kwargs", [dict(k=-1), dict(min_n=0), dict(min_n=3, max_n=2)])
def test_invalid_settings(kwargs):
    with pytest.raises(ValueError):
        NgramProposer(**kwargs)


def test_speed_on_8k_tokens():
    """Printed, not asserted: per-call cost on an 8k context with a copied span."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 32000, size=8000).tolist()
    tokens = prompt + prompt[1000:1010]  # the output starts copying the prompt
    proposer = NgramProposer(k=4)
    calls = 300
    start = time.perf_counter()
    for i in range(calls):
        proposal = proposer.propose_for("r", tokens)
        tokens.append(prompt[1010 + i])
    per_call = (time.perf_counter() - start) / calls * 1e6
    assert proposal == prompt[1009 + calls:1013 + calls]  # made before the last append
    array = np.array(tokens, dtype=np.int64)
    start = time.perf_counter()
    for _ in range(calls):
        find_ngram_continuation(array, 4)
    per_array_call = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for _ in range(30):
        find_ngram_continuation(np.array(tokens, dtype=np.int64), 4)
    per_list_call = (time.perf_counter() - start) / 30 * 1e6
    print(f"\n  ngram on {len(tokens)} tokens: propose_for {per_call:.0f} us/call, "
          f"search of an array {per_array_call:.0f} us, of a list {per_list_call:.0f} us")


def test_prompt_lookup_min_sets_the_shortest_match_that_proposes():
    tokens = [5, 6, 9, 1, 5, 6]  # the last 2 tokens occurred before, the last 3 did not
    assert build_proposer(EngineConfig(model="m", speculative_method="ngram")).propose_for("a", tokens, 2) == [9, 1]
    strict = build_proposer(EngineConfig(model="m", speculative_method="ngram", prompt_lookup_min=3))
    assert strict.propose_for("b", tokens, 2) == []
    assert strict.propose_for("c", tokens + [9], 2) == [1, 5]


@pytest.mark.parametrize("shortest", [0, 5])
def test_prompt_lookup_min_out_of_range_is_refused(shortest):
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        EngineConfig(model="m", speculative_method="ngram", prompt_lookup_min=shortest)
