"""Speculation inside the engine, on the real default pair: greedy output identical token for
token to plain decoding (draft model and n-gram, k = 1, 4, 8, mixed lengths, preemption
forced), nothing left allocated, seeded sampling independent of the batch, logprobs unchanged,
and a failing proposer only turns speculation off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.spec.proposal import DraftInput, Proposal
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET

SOURCE = Path(json.__file__).read_text()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    snippet = SOURCE[3000:3600]
    texts = ["def add(a, b):", "import os\n", f"Repeat:\n{snippet}\nAgain:\n{snippet[:150]}",
             SOURCE[9000:9400], "class Point:\n    def __init__(self"]
    return [tok.encode(t) for t in texts]


def engine(method: str | None = None, k: int = 4, **overrides) -> LLMEngine:
    """k drafts in every step (adaptive k is tests/spec/test_adaptive_speculation.py's)."""
    overrides.setdefault("num_kv_blocks", 256)
    overrides.setdefault("adaptive_speculation", False)
    return LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), draft_model=str(DEFAULT_DRAFT),
                                  speculative_method=method, speculation_schedule={1: k},
                                  **overrides))


def assert_nothing_allocated(e: LLMEngine) -> None:
    assert e.block_manager.num_used_blocks == 0
    assert not e.block_manager.request_blocks
    assert not e.requests


GREEDY = SamplingParams(max_tokens=48, temperature=0.0)


@pytest.fixture(scope="module")
def reference(prompts):
    return engine().generate(prompts, GREEDY)


@pytest.mark.parametrize("method,k", [("draft", 1), ("draft", 4), ("draft", 8), ("ngram", 1),
                                      ("ngram", 4), ("ngram", 8)])
def test_greedy_output_identical_to_plain_decoding(prompts, reference, method, k):
    e = engine(method, k)
    assert e.generate(prompts, GREEDY) == reference
    spec = e.stats().spec
    assert spec.num_draft_tokens > 0 and spec.num_accepted_tokens > 0
    assert spec.num_accepted_tokens < spec.num_draft_tokens  # rejections happened and were handled
    assert_nothing_allocated(e)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_greedy_identical_under_preemption_and_chunked_prefill(prompts, reference, method):
    e = engine(method, 4, num_kv_blocks=24, max_num_batched_tokens=40)
    assert e.generate(prompts, GREEDY) == reference
    assert e.stats().num_preemptions > 0
    assert e.stats().spec.num_accepted_tokens > 0
    assert_nothing_allocated(e)


def test_opted_out_request_is_never_speculated(prompts):
    e = engine("ngram", 4)
    e.generate([prompts[2]], SamplingParams(max_tokens=32, temperature=0.0, speculative_decoding=False))
    assert e.stats().spec.num_drafts == 0


def test_seeded_sample_same_alone_and_in_a_batch(prompts):
    params = SamplingParams(max_tokens=40, temperature=1.0, top_p=0.95, seed=11, ignore_eos=True)
    alone = engine("draft", 4).generate([prompts[0]], params)[0]
    others = SamplingParams(max_tokens=30, temperature=0.8)
    batched = engine("draft", 4).generate(prompts, [params] + [others] * (len(prompts) - 1))[0]
    assert alone == batched
    assert len(alone) == 40


def test_logprobs_match_plain_decoding(prompts):
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)

    def run(e):
        e.add_request("r", prompts[2], params)
        out = []
        while e.has_unfinished_requests():
            for o in e.step():
                out += o.new_logprobs or []
        return out

    plain, spec = run(engine()), run(engine("ngram", 4))
    assert [lp.token_id for lp in spec] == [lp.token_id for lp in plain]
    for a, b in zip(spec, plain):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert a.top.keys() == b.top.keys()


def test_abort_mid_speculation_frees_everything(prompts):
    e = engine("draft", 4)
    for i, p in enumerate(prompts):
        e.add_request(str(i), p, SamplingParams(max_tokens=40, temperature=0.7, ignore_eos=True))
    for _ in range(6):
        e.step()
    assert e.stats().spec.num_drafts > 0
    for i in range(len(prompts)):
        e.abort_request(str(i))
    assert_nothing_allocated(e)


class FailingProposer:
    def __init__(self):
        self.calls = 0

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        self.calls += 1
        raise ConnectionError("draft replica is gone")


def test_failing_proposer_turns_speculation_off_for_the_step(prompts, reference):
    proposer = FailingProposer()
    e = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256, speculative_method="draft",
                               speculation_schedule={1: 4}), proposer=proposer)
    assert e.generate(prompts, GREEDY) == reference
    assert proposer.calls > 0 and e.speculator.stats.num_proposer_failures == proposer.calls


def test_schedule_turns_speculation_off_at_large_batches(prompts):
    e = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256, speculative_method="ngram",
                               speculation_schedule={1: 4, 4: 0}))
    e.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert e.stats().spec.num_drafts == 0  # five requests: k = 0 every step
    e.generate(prompts[2:3], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert e.stats().spec.num_drafts > 0


def test_requests_waiting_to_start_count_toward_the_batch_size_that_sets_k(prompts):
    """A burst of arrivals turns speculation off before its prompts are read: the step that
    reads them does not wait on drafts for the one request already decoding."""
    e = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256, speculative_method="ngram",
                               speculation_schedule={1: 4, 4: 0}, adaptive_speculation=False))
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    e.add_request("first", prompts[2], greedy)
    while not e.requests["first"].is_decoding:
        e.step()
    e.step()
    assert e.stats().spec.steps_by_k == {4: 1}  # alone: the schedule's k for one request
    for i in range(3):
        e.add_request(f"late-{i}", prompts[i], greedy)  # one running and three waiting: batch 4
    e.step()
    assert e.stats().spec.steps_by_k == {4: 1, 0: 1}
    assert all(not r.spec_token_ids for r in e.scheduler.running)


@pytest.mark.parametrize("steps_while_busy,expect_drafts", [(25, False), (5, True)])
def test_a_request_left_alone_drafts_only_if_more_tokens_remain_than_the_draft_missed(
        prompts, steps_while_busy, expect_drafts):
    """Four requests decode with k = 0; then three end. The draft model never read the last
    one's output: with 15 tokens left and 25 unread it is not worth reading; with 35 left and 5 unread it is."""
    e = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), draft_model=str(DEFAULT_DRAFT), num_kv_blocks=256,
                               speculative_method="draft", speculation_schedule={1: 4, 4: 0},
                               adaptive_speculation=False))
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    for i in range(4):
        e.add_request(f"r{i}", prompts[i], greedy)
    while not all(r.is_decoding for r in e.scheduler.running):
        e.step()
    for _ in range(steps_while_busy):
        e.step()
    for i in range(1, 4):
        e.abort_request(f"r{i}")
    assert e.stats().spec.num_proposals == 0
    while e.has_unfinished_requests():
        e.step()
    assert (e.stats().spec.num_proposals > 0) == expect_drafts


def test_spec_step_emits_several_tokens(prompts):
    e = engine("ngram", 8)
    e.add_request("r", prompts[2], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    sizes = []
    while e.has_unfinished_requests():
        sizes += [len(o.new_token_ids) for o in e.step()]
    assert max(sizes) > 1 and sum(sizes) == 40


def test_ngram_state_is_dropped_when_requests_finish_or_abort(prompts):
    e = engine("ngram", 4)
    for i, p in enumerate(prompts):
        e.add_request(str(i), p, SamplingParams(max_tokens=12 if i % 2 else 200, temperature=0.0,
                                                ignore_eos=True))
    for _ in range(14):
        e.step()
    proposer = e.speculator.proposer
    assert set(proposer._buffers) == {"0", "2", "4"}  # the short ones finished and were dropped
    for rid in ("0", "2", "4"):
        e.abort_request(rid)
    assert not proposer._buffers
    assert_nothing_allocated(e)
