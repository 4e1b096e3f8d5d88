"""Drafts sent ahead (app/engine/spec/drafts_ahead.py): while a step verifies (or reads a
prompt), the next step's drafts are asked for on the draft channel. Greedy output stays that of
plain decoding whether the guess held or a draft was rejected mid-pipeline; only greedy rows
that sample after all their scheduled drafts or their prompt are sent; the channel reads each
answer in order, and a lost one costs only that step's head start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.request import Request
from app.engine.spec.draft_channel import DirectDraftProposer, DraftChannelServer
from app.engine.spec.drafts_ahead import DraftsAhead
from app.engine.spec.proposal import DraftInput, Proposal
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_TARGET
from tests.spec.test_draft_channel import ServePath, inputs, worker  # noqa: F401 - worker: the shared fixture

SOURCE = Path(json.__file__).read_text()
GREEDY = SamplingParams(max_tokens=48, temperature=0.0)


def engine(proposer=None, **overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), speculative_method="draft" if proposer else None,
                                  num_kv_blocks=256, speculation_schedule={1: 4, 4: 2}, adaptive_speculation=False,
                                  **overrides), proposer)


def test_greedy_output_is_plain_decodings_whether_the_guess_held_or_a_draft_was_rejected(worker):
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    snippet = SOURCE[3000:3600]
    prompts = [tok.encode(t) for t in (f"Repeat:\n{snippet}\nAgain:\n{snippet[:150]}", SOURCE[9000:9400],
                                       "def add(a, b):")]
    server = DraftChannelServer(worker.propose_batch, "127.0.0.1")
    proposer = DirectDraftProposer(ServePath(server))
    try:
        speculating = engine(proposer)
        alone = [speculating.generate([p], GREEDY)[0] for p in prompts]
        together = speculating.generate(prompts, GREEDY)  # k = 2 in a batch of 3
    finally:
        proposer.close()
        server.close()
    reference = engine().generate(prompts, GREEDY)
    assert alone == reference and together == reference
    stats = speculating.speculator.stats
    assert 0 < stats.num_drafts_ahead_used < stats.num_drafts_sent_ahead  # held, and rejected mid-pipeline
    assert stats.num_accepted_tokens > 0


class Recorder:
    """A proposer that answers later: records what was sent ahead, answers with `answers`."""

    def __init__(self, answers: list[list[int]] | None = None):
        self.sent: list[list[DraftInput]] = []
        self.answers = answers

    def __call__(self, batch: list[DraftInput]):
        self.sent.append(batch)
        return self

    def result(self):
        return None if self.answers is None else [Proposal(list(a)) for a in self.answers]


GREEDY_20 = SamplingParams(max_tokens=20, temperature=0.0)


def decoding(prompt: list[int], params: SamplingParams, drafts: list[int], outputs: tuple[int, ...] = ()
             ) -> Request:
    req = Request("r", prompt, params)
    req.all_token_ids += outputs
    req.num_computed_tokens = req.num_tokens - 1
    req.set_spec(drafts)
    return req


def test_greedy_rows_that_sample_after_their_drafts_or_their_prompt_are_sent_ahead():
    greedy = decoding([5, 6, 7], GREEDY_20, [8, 9])
    prompt = Request("r", [1, 2, 3, 4], GREEDY_20)  # its whole prompt this step
    sampled = decoding([5, 6, 7], SamplingParams(max_tokens=20, temperature=0.8), [8, 9])
    opted_out = Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=20, temperature=0.0, speculative_decoding=False))
    trimmed = decoding([5, 6, 7], GREEDY_20, [8, 9])
    near_the_end = decoding([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0), [8])
    no_drafts = decoding([5, 6], GREEDY_20, [], outputs=(7,))
    chunk = Request("r", [1, 2, 3, 4], GREEDY_20)  # a prompt chunk that samples nothing
    send = Recorder()
    ahead = DraftsAhead(send, max_model_len=64)
    batch = {greedy: 3, prompt: 4, sampled: 3, opted_out: 4, trimmed: 2,  # `trimmed`: 1 of its 2 drafts
             near_the_end: 2, no_drafts: 1, chunk: 2}
    assert ahead.send(batch, k=4) == 2
    [[after_drafts, after_prompt]] = send.sent
    assert after_drafts.token_ids == [5, 6, 7, 8, 9] and after_drafts.k == 5 and after_drafts.greedy  # a guess, k drafts
    assert after_prompt.token_ids == [1, 2, 3, 4] and after_prompt.k == 5


@pytest.mark.parametrize("accepted,target_token,expect_ready", [
    ([8, 9], 10, True),    # every draft accepted and the target's token was the guess
    ([8, 9], 11, False),   # every draft accepted, another token than the guess
    ([8], 12, False),      # the second draft rejected
])
def test_drafts_are_ready_only_when_every_draft_and_the_guess_held(accepted, target_token, expect_ready):
    req = decoding([5, 6, 7], GREEDY_20, [8, 9])
    ahead = DraftsAhead(Recorder(answers=[[10, 20, 21, 22, 23]]), max_model_len=64)
    ahead.send({req: 3}, k=4)
    req.set_spec([])
    req.all_token_ids += accepted + [target_token]
    assert ahead.take() == ({req: [20, 21, 22, 23]} if expect_ready else {})
    assert ahead.take() == {}  # an answer is taken once


@pytest.mark.parametrize("first_token,expect_ready", [(10, True), (11, False)])
def test_after_a_prompt_drafts_are_ready_when_the_first_token_was_the_guess(first_token, expect_ready):
    req = Request("r", [1, 2, 3, 4], GREEDY_20)
    ahead = DraftsAhead(Recorder(answers=[[10, 20, 21]]), max_model_len=64)
    ahead.send({req: 4}, k=2)
    req.num_computed_tokens = 4
    req.all_token_ids.append(first_token)
    assert ahead.take() == ({req: [20, 21]} if expect_ready else {})


def test_lost_drafts_ahead_leave_the_next_step_to_ask():
    req = decoding([5, 6, 7], GREEDY_20, [8])
    ahead = DraftsAhead(Recorder(answers=None), max_model_len=64)
    ahead.send({req: 2}, k=4)
    req.all_token_ids += [8, 10]
    assert ahead.take() == {}


def test_the_channel_answers_in_order_after_a_proposal_sent_ahead(worker):
    server = DraftChannelServer(worker.propose_batch, "127.0.0.1")
    proposer = DirectDraftProposer(ServePath(server))
    first, second = inputs()[:1], inputs()[1:]
    try:
        assert proposer.send_ahead(first) is None  # no channel yet: sending ahead never searches
        proposer.propose_batch(first)  # finds the channel
        pending = proposer.send_ahead(first)
        got = proposer.propose_batch(second)  # reads the answer sent ahead first, then its own
        assert [p.token_ids for p in got] == [p.token_ids for p in worker.propose_batch(second)]
        assert [p.token_ids for p in pending.result()] == [p.token_ids for p in worker.propose_batch(first)]
        server.close()
        pending = proposer.send_ahead(first)
        assert pending is None or pending.result() is None  # the channel broke: nothing comes
        assert proposer.propose_batch(first) == [Proposal([])]  # through Serve meanwhile
    finally:
        proposer.close()
        server.close()
