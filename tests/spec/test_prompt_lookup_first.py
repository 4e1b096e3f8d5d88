"""Prompt lookup before the draft model (`prompt_lookup_first`): a row whose last tokens
occurred earlier in its own tokens takes what followed them as drafts, without a draft call, and
is not sent ahead; greedy output stays plain decoding's; rows with no match still ask the draft
model; the lookup's state goes when its request does."""

from __future__ import annotations

import pytest

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.request import Request
from app.engine.spec.draft_worker import DraftWorker
from app.engine.spec.proposal import DraftInput, Proposal
from app.engine.spec.schedule import SpeculationSchedule
from app.engine.spec.speculator import LOOKUP_FIRST_MIN_MATCH, Speculator
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET
from tests.spec.test_engine_speculation import (GREEDY, assert_nothing_allocated, engine, prompts,  # noqa: F401
                                                reference)


class CountingDraftModel:
    """The real draft model, counting the rows it is asked to draft for."""

    def __init__(self):
        self.worker = DraftWorker(EngineConfig(model=str(DEFAULT_DRAFT), num_kv_blocks=256))
        self.rows_asked = 0

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        self.rows_asked += len(inputs)
        return self.worker.propose_batch(inputs)


def draft_engine(proposer, prompt_lookup_first: bool) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256, speculative_method="draft",
                                  speculation_schedule={1: 4}, adaptive_speculation=False,
                                  prompt_lookup_first=prompt_lookup_first), proposer)


def test_copying_rows_draft_without_asking_the_draft_model(prompts, reference):
    with_lookup, without = CountingDraftModel(), CountingDraftModel()
    looking_up = draft_engine(with_lookup, prompt_lookup_first=True)
    asking = draft_engine(without, prompt_lookup_first=False)
    assert looking_up.generate(prompts, GREEDY) == reference
    assert asking.generate(prompts, GREEDY) == reference
    spec = looking_up.stats().spec
    assert spec.num_drafts_looked_up > 0 and spec.num_accepted_tokens > 0
    assert asking.stats().spec.num_drafts_looked_up == 0
    assert 0 < with_lookup.rows_asked < without.rows_asked  # rows with no match still asked
    assert_nothing_allocated(looking_up)


class Asked:
    """A proposer that can send ahead, recording what it was asked and sent."""

    def __init__(self):
        self.asked: list[list[str]] = []
        self.sent_ahead: list[list[str]] = []

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        self.asked.append([i.request_id for i in inputs])
        return [Proposal([7] * i.k) for i in inputs]

    def send_ahead(self, inputs: list[DraftInput]):
        self.sent_ahead.append([i.request_id for i in inputs])
        return None


def decoding(request_id: str, tokens: list[int]) -> Request:
    req = Request(request_id, tokens, SamplingParams(max_tokens=20, temperature=0.0))
    req.num_computed_tokens = req.num_tokens - 1
    return req


@pytest.mark.parametrize("prompt_lookup_first", [True, False])
def test_a_row_found_by_lookup_is_neither_asked_nor_sent_ahead(prompt_lookup_first):
    proposer = Asked()
    speculator = Speculator(proposer, SpeculationSchedule({1: 4}), max_model_len=64, vocab_width=100,
                            prompt_lookup_first=prompt_lookup_first)
    copying = decoding("copying", [1, 2, 3, 4, 5, 6, 1, 2, 3])  # its last 3 tokens occurred before
    short_match = decoding("short", [8, 2, 3, 9, 10, 2, 3])  # only 2 do: too short to trust
    fresh = decoding("fresh", [10, 11, 12, 13])
    speculator.propose([copying, short_match, fresh])
    if prompt_lookup_first:
        assert LOOKUP_FIRST_MIN_MATCH == 3
        assert copying.spec_token_ids == [4, 5, 6, 1]
        assert proposer.asked == [["short", "fresh"]]
        assert speculator.stats.num_drafts_looked_up == 1
    else:
        assert proposer.asked == [["copying", "short", "fresh"]]
    speculator.send_ahead({copying: 5, short_match: 5, fresh: 5})
    assert proposer.sent_ahead == [["short", "fresh"] if prompt_lookup_first else ["copying", "short", "fresh"]]


def test_lookup_state_is_dropped_when_requests_finish_or_abort(prompts):
    e = engine("draft", 4, prompt_lookup_first=True)
    for i, p in enumerate(prompts):
        e.add_request(str(i), p, SamplingParams(max_tokens=12 if i % 2 else 200, temperature=0.0,
                                                ignore_eos=True))
    for _ in range(14):
        e.step()
    assert set(e.speculator.lookup._buffers) == {"0", "2", "4"}  # the short ones finished and were dropped
    for rid in ("0", "2", "4"):
        e.abort_request(rid)
    assert not e.speculator.lookup._buffers
    assert_nothing_allocated(e)
