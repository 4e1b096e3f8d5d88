"""n-gram lookup in the outputs of the requests that finished last: what followed the longest
n-gram, at most k tokens, cut where the output ended; prompts are not kept; the newest
occurrence wins; the table stays within its bound; a request's own tokens are searched first;
and in the engine, a request that repeats an earlier one's output drafts from it and still
decodes exactly what plain decoding does."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.spec.ngram_proposer import NgramProposer
from app.engine.spec.recent_outputs import RecentOutputs
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET


def table(capacity_tokens: int = 1000, k: int = 3, min_n: int = 2, max_n: int = 3) -> RecentOutputs:
    return RecentOutputs(capacity_tokens, k, min_n, max_n)


def test_what_followed_the_longest_ngram_in_an_output():
    recent = table()
    recent.add([100, 101, 1, 2, 3, 4, 5, 6, 2, 3, 9], num_prompt_tokens=2)
    assert recent.lookup([50, 1, 2, 3], k=3) == [4, 5, 6]  # [1, 2, 3] beats [2, 3] -> 9 that came later
    assert recent.lookup([50, 7, 2, 3], k=3) == [9]  # only [2, 3] matches: its latest follower, cut at the end
    assert recent.lookup([4, 5], k=2) == [6, 2]
    assert recent.lookup([8, 9], k=3) == []


def test_prompt_tokens_are_kept_only_as_the_lead_in_to_the_output():
    recent = table()
    recent.add([10, 11, 12, 13, 14, 15, 1, 2], num_prompt_tokens=6)
    assert recent.lookup([11, 12], k=3) == []  # inside the prompt
    assert recent.lookup([14, 15], k=3) == [1, 2]  # the prompt's last tokens, then the output
    assert recent.lookup([15, 1], k=3) == [2]


def test_min_n_is_respected():
    recent = table(min_n=2)
    recent.add([1, 2, 3, 4], num_prompt_tokens=0)
    assert recent.lookup([9, 3], k=2) == []
    assert table(min_n=1).lookup([3], k=2) == []
    one = table(min_n=1)
    one.add([1, 2, 3, 4], num_prompt_tokens=0)
    assert one.lookup([9, 3], k=2) == [4]


def test_newest_occurrence_wins_and_the_table_stays_bounded():
    recent = table(capacity_tokens=20, k=2, min_n=2, max_n=2)
    recent.add([1, 2, 3], num_prompt_tokens=0)
    recent.add([1, 2, 4], num_prompt_tokens=0)
    assert recent.lookup([1, 2], k=2) == [4]
    for start in range(100, 400, 10):
        recent.add(list(range(start, start + 10)), num_prompt_tokens=0)
    assert len(recent) <= 20
    assert recent.lookup([1, 2], k=2) == []  # written first, gone first
    assert recent.lookup([391, 392], k=2) == [393, 394]


def test_own_tokens_first_then_recent_outputs():
    proposer = NgramProposer(k=4, min_n=2, max_n=4, recent_output_tokens=1000)
    proposer.recent_outputs.add([7, 8, 1, 2, 3], num_prompt_tokens=0)
    assert proposer.propose_for("own", [7, 8, 5, 6, 7, 8]) == [5, 6, 7, 8]  # its own match
    assert proposer.propose_for("recent", [9, 9, 0, 7, 8]) == [1, 2, 3]  # none of its own
    assert NgramProposer(k=4, min_n=2, max_n=4).propose_for("recent", [9, 9, 0, 7, 8]) == []


GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("recent_tokens", [0, 4096])
def test_a_request_drafts_from_an_earlier_output_and_decodes_exactly(recent_tokens):
    prompt = AutoTokenizer.from_pretrained(DEFAULT_TARGET).encode("def add(a, b):")
    plain = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64)).generate([prompt], GREEDY)[0]
    e = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64, speculative_method="ngram",
                               prompt_lookup_min=3, adaptive_speculation=False, speculation_schedule={1: 4},
                               lookup_recent_output_tokens=recent_tokens))
    assert e.generate([prompt], GREEDY)[0] == plain
    before = e.stats().spec.num_accepted_tokens
    assert e.generate([prompt], GREEDY)[0] == plain
    accepted_again = e.stats().spec.num_accepted_tokens - before
    from_recent = e.stats().spec.num_drafts_from_recent_outputs
    if recent_tokens:
        assert accepted_again >= len(plain) // 2  # the first run's output, drafted back
        assert from_recent > 0
    else:
        assert accepted_again == before  # own tokens only: the same drafts as the first time
        assert from_recent == 0
    assert e.block_manager.num_used_blocks == 0


def test_the_draft_models_lookup_first_also_searches_recent_outputs():
    prompt = AutoTokenizer.from_pretrained(DEFAULT_TARGET).encode("def add(a, b):")
    plain = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64)).generate([prompt], GREEDY)[0]
    e = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), draft_model=str(DEFAULT_DRAFT), num_kv_blocks=64,
                               speculative_method="draft", adaptive_speculation=False, speculation_schedule={1: 4}))
    assert e.generate([prompt], GREEDY)[0] == plain
    looked_up = e.stats().spec.num_drafts_looked_up
    assert e.generate([prompt], GREEDY)[0] == plain
    spec = e.stats().spec
    assert spec.num_drafts_from_recent_outputs > 0
    assert spec.num_drafts_looked_up > 2 * looked_up  # the second time, the first output answers most steps
