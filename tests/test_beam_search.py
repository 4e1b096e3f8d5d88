"""Beam search equals transformers `generate(num_beams=B, num_return_sequences=n,
do_sample=False, length_penalty=..., early_stopping=...)` on the default model in fp32; the beams
share their blocks (copy on write where they diverge) and leave none behind."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.outputs import RequestRejected
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_TARGET

TEXTS = ["def fibonacci(n):", "import os\nimport sys\n\n\ndef main(argv):\n    ",
         "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
         "# Copyright"]
# (beams, returned, length_penalty, early_stopping, max_tokens)
CASES = [(4, 2, 1.0, False, 24), (3, 3, 0.0, True, 16), (5, 2, 2.0, "never", 20), (2, 1, -0.5, False, 12)]


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    return [tok(t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def hf_model():
    return AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET, dtype=torch.float32).eval()


def transformers_beams(model, prompt, beams, n, length_penalty, early_stopping, max_tokens):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, num_beams=beams,
                         num_return_sequences=n, do_sample=False, length_penalty=length_penalty,
                         early_stopping=early_stopping, pad_token_id=0)
    eos = set(model.generation_config.eos_token_id)
    results = []
    for row in out[:, len(prompt):].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        results.append(row[:end])
    return results


def beam_params(beams, length_penalty, early_stopping, max_tokens):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, beam_width=beams,
                          length_penalty=length_penalty, early_stopping=early_stopping)


def run(engine, requests):
    """requests: id -> (prompt, params). Returns id -> beams (beam search) or token ids."""
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    results = {rid: [] for rid in requests}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.beams is not None:
                results[out.request_id] = out.beams
            else:
                results[out.request_id] += out.new_token_ids
    return results


@pytest.mark.parametrize("beams,n,length_penalty,early_stopping,max_tokens", CASES)
def test_equals_transformers(prompts, hf_model, beams, n, length_penalty, early_stopping, max_tokens):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256))
    params = beam_params(beams, length_penalty, early_stopping, max_tokens)
    results = run(engine, {f"r{i}": (p, params) for i, p in enumerate(prompts)})  # all searches in one batch
    for i, prompt in enumerate(prompts):
        expected = transformers_beams(hf_model, prompt, beams, n, length_penalty, early_stopping, max_tokens)
        got = results[f"r{i}"][:n]
        assert [h.token_ids for h in got] == expected, f"prompt {i}"
        for h in got:
            assert h.score == pytest.approx(h.cumulative_logprob / len(h.token_ids) ** length_penalty)
            assert h.finish_reason == ("stop" if h.token_ids[-1] in (0, 4) else "length")
        assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
    assert engine.block_manager.num_used_blocks == 0


def test_beams_share_the_prompt_blocks_and_copy_where_they_diverge(prompts):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64, block_size=16))
    prompt = (prompts[2] + prompts[1])[:40]  # 2 full blocks and a partial one
    engine.add_request("r", prompt, beam_params(4, 1.0, False, 8))
    engine.step()  # the prompt, then the first decision
    search = engine.beam_searches["r"]
    handles = [beam.handle for beam in search.live]
    assert len(handles) == 4
    tables = [engine.block_manager.request_blocks[h.request_id] for h in handles]
    # Every beam holds the prompt's two full blocks (one copy, four references)...
    for j in range(2):
        assert len({t[j].block_id for t in tables}) == 1 and tables[0][j].ref_count == 4
    # ...and, until its first write, the partial block too.
    assert len({t[2].block_id for t in tables}) == 1 and tables[0][2].ref_count == 4
    used_before = engine.block_manager.num_used_blocks
    engine.step()  # each beam writes into the partial block: three copies, the last writer keeps it
    tables = [engine.block_manager.request_blocks[h.request_id] for h in handles if not h.is_finished]
    assert engine.block_manager.num_used_blocks <= used_before + 3
    assert tables[0][0].ref_count >= len(tables)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_same_beams_under_preemption_and_beside_plain_requests(prompts, hf_model, policy):
    """A pool too small for everything at once: beams are preempted and recomputed (their
    searches wait for them) and plain greedy requests run beside; the results do not change,
    under either scheduling policy."""
    params = beam_params(4, 1.0, False, 24)
    expected = [transformers_beams(hf_model, p, 4, 4, 1.0, False, 24) for p in prompts]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256))
    plain_alone = alone.generate(prompts, greedy)
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=24, max_num_batched_tokens=64,
                                    scheduling_policy=policy))
    requests = {f"b{i}": (p, params) for i, p in enumerate(prompts)}
    requests.update({f"g{i}": (p, greedy) for i, p in enumerate(prompts)})
    results = run(engine, requests)
    assert engine.stats().num_preemptions > 0
    assert [[h.token_ids for h in results[f"b{i}"]] for i in range(len(prompts))] == expected
    assert [results[f"g{i}"] for i in range(len(prompts))] == plain_alone
    assert engine.block_manager.num_used_blocks == 0


def test_abort_mid_search_frees_every_block(prompts):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64))
    engine.add_request("r", prompts[1], beam_params(4, 1.0, False, 32))
    for _ in range(3):
        engine.step()
    assert len(engine.beam_searches["r"].live) == 4
    engine.abort_request("r")
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_used_blocks == 0 and not engine.beam_searches


def test_refused_when_the_beams_cannot_fit(prompts):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=16, block_size=16))
    engine.validate(prompts[0], beam_params(2, 1.0, False, 100))  # 2 x 7 blocks fit in 16, 4 x 7 do not
    with pytest.raises(RequestRejected, match="beams"):
        engine.add_request("r", prompts[0], beam_params(4, 1.0, False, 100))
    assert not engine.has_unfinished_requests()


def test_parked_beams_make_room_for_the_rest_of_their_search():
    """Beams that reported wait, holding their blocks, for the other beams of their search. If
    those wait in the queue and cannot fit, the parked beams are preempted to the back of the
    queue (their report stands) instead of every step scheduling nothing."""
    from app.engine.block_manager import BlockManager
    from app.engine.request import Request, RequestStatus
    from app.engine.scheduler import Scheduler

    bm = BlockManager(num_blocks=4, block_size=4)
    scheduler = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64)
    parked = []
    for i in range(2):
        req = Request(f"parked-{i}", [1, 2, 3, 4, 5], SamplingParams())
        assert bm.allocate(req, 5)
        req.num_computed_tokens = req.num_tokens  # reported: nothing left to compute
        req.status = RequestStatus.RUNNING
        scheduler.running.append(req)
        parked.append(req)
    sibling = Request("sibling", [1, 2, 3, 4, 6], SamplingParams())
    scheduler.add(sibling)
    assert bm.num_free_blocks == 0
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {sibling: 5}
    assert scheduler.running == [parked[0], sibling]
    assert list(scheduler.waiting) == [parked[1]] and parked[1].num_computed_tokens == 0


def test_a_beam_ended_by_a_stop_token_names_it(prompts):
    """vLLM's `stop_reason` for beams: the request's own stop token that ended a beam; none for
    the model's EOS, nor at the length limit."""
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64))
    params = beam_params(3, 0.0, False, 12)  # no length normalisation: short beams compete
    free = run(engine, {"r": (prompts[0], params)})["r"]
    stop = free[0].token_ids[2]  # a token the best beam produces early
    stopped = run(engine, {"s": (prompts[0], dataclasses.replace(params, stop_token_ids=[stop]))})["s"]
    eos = set(engine.model_config.eos_token_ids)
    for h in free + stopped:
        last = h.token_ids[-1]
        own = h.finish_reason == "stop" and last == stop and h in stopped
        assert h.stop_token_id == (last if own else None), (h.token_ids, h.finish_reason)
        assert h.stop_token_id is not None or h.finish_reason == "length" or last in eos
    assert any(h.stop_token_id == stop for h in stopped)
