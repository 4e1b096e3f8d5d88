"""Overlapped scheduling (app/engine/engine.py): step N+1 is scheduled and launched before step
N's tokens reach the host, its inputs read them on the device. On the CPU nothing runs beside
anything, but every path is the same, so the tokens must be those of the plain engine, with
stops, aborts and preemption taking effect, and no block left held."""

from __future__ import annotations

import pytest

from app.sampling_params import SamplingParams
from tests.test_engine import assert_no_block_referenced, make_engine, prompts
from tests.test_engine import checkpoint  # noqa: F401  (the fixture)


def assert_nothing_held(engine) -> None:
    assert engine.in_flight is None and not engine.has_unfinished_requests()
    assert_no_block_referenced(engine)
    assert not engine.block_manager.tables.row_of


def mixed_params(n: int) -> list[SamplingParams]:
    """Greedy and seeded sampled requests of different lengths; some stop on tokens the model
    is likely to produce, which no host-side rule can see coming."""
    out = []
    for i in range(n):
        common = dict(max_tokens=1 + (7 * i) % 23, seed=i if i % 2 else None,
                      stop_token_ids=list(range(100 + i, 400, 3)) if i % 3 == 0 else [])
        out.append(SamplingParams(temperature=0.0 if i % 2 == 0 else 0.9, top_p=0.9 if i % 4 == 1 else 1.0,
                                  ignore_eos=True, **common))
    return out


@pytest.mark.parametrize("pool", [{}, dict(num_kv_blocks=24, max_num_batched_tokens=48)])
def test_overlapped_steps_give_the_plain_engines_tokens(checkpoint, pool):
    """Greedy and seeded requests, with chunked prompts; the small pool also preempts."""
    batch, params = prompts(12, seed=1), mixed_params(12)
    expected = make_engine(checkpoint, overlap_scheduling=False, **pool).generate(batch, params)
    engine = make_engine(checkpoint, overlap_scheduling=True, **pool)
    assert engine.generate(batch, params) == expected
    if pool:
        assert engine.stats().num_preemptions > 0
    assert any(len(t) < p.max_tokens for t, p in zip(expected, params)), "no request stopped on a token"
    assert_nothing_held(engine)


def test_a_step_left_in_flight_returns_its_tokens_with_the_next_call(checkpoint):
    engine = make_engine(checkpoint, overlap_scheduling=True)
    engine.add_request("a", prompts(1)[0], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    first = engine.step()
    assert first == [] and engine.in_flight is not None
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    assert [len(o.new_token_ids) for o in outputs] == [1, 1, 1] and outputs[-1].finished
    assert engine.stats().num_steps == 3  # no step is launched for a request its last token ends
    assert_nothing_held(engine)


def test_a_request_aborted_while_its_step_is_in_flight_gets_nothing_more(checkpoint):
    engine = make_engine(checkpoint, overlap_scheduling=True)
    for i, p in enumerate(prompts(4, seed=2)):
        engine.add_request(str(i), p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    for _ in range(5):
        engine.step()
    assert engine.in_flight is not None
    engine.abort_request("1")
    later = []
    while engine.has_unfinished_requests():
        later += engine.step()
    assert "1" not in {o.request_id for o in later}
    assert {o.request_id for o in later if o.finished} == {"0", "2", "3"}
    assert_nothing_held(engine)


def test_steps_with_penalties_or_beams_run_one_at_a_time(checkpoint):
    """Their next step needs this step's tokens on the host, so nothing is left in flight."""
    engine = make_engine(checkpoint, overlap_scheduling=True)
    engine.add_request("p", prompts(1)[0], SamplingParams(max_tokens=4, temperature=0, presence_penalty=1.0))
    engine.step()
    assert engine.in_flight is None
    while engine.has_unfinished_requests():
        engine.step()
        assert engine.in_flight is None
    expected = make_engine(checkpoint, overlap_scheduling=False).generate(
        prompts(2, seed=3), [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, beam_width=2),
                             SamplingParams(max_tokens=6, temperature=0, frequency_penalty=1.5, ignore_eos=True)])
    assert engine.generate(prompts(2, seed=3), [
        SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, beam_width=2),
        SamplingParams(max_tokens=6, temperature=0, frequency_penalty=1.5, ignore_eos=True)]) == expected
    assert_nothing_held(engine)


def test_overlap_is_on_where_the_device_runs_beside_the_host(checkpoint):
    assert make_engine(checkpoint, overlap_scheduling=None).overlap_scheduling is False  # CPU


def run_counting_overlap(engine, batch, params) -> tuple[list[list[int]], int]:
    """(each request's tokens, steps that returned with a step left in flight)."""
    ids = [str(i) for i in range(len(batch))]
    for rid, prompt, p in zip(ids, batch, params):
        engine.add_request(rid, prompt, p)
    tokens, overlapped = {rid: [] for rid in ids}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        overlapped += engine.in_flight is not None
    return [tokens[rid] for rid in ids], overlapped


def repetitive_prompts(n: int) -> list[list[int]]:
    """Prompts that repeat a phrase, so n-gram lookup finds drafts in them."""
    return [[7 + i, 40 + i, 90 + i, 130 + i] * (3 + i % 4) for i in range(n)]


def test_a_speculating_engine_overlaps_the_steps_that_draft_nothing(checkpoint):
    """k is 0 from 4 running requests up: those steps run ahead; the steps that draft wait for
    the tokens in flight first. Greedy tokens stay the plain engine's."""
    batch = repetitive_prompts(6)
    params = [SamplingParams(max_tokens=4 + 5 * i, temperature=0, ignore_eos=True) for i in range(6)]
    expected = make_engine(checkpoint, overlap_scheduling=False).generate(batch, params)
    engine = make_engine(checkpoint, overlap_scheduling=True, speculative_method="ngram",
                         speculation_schedule={1: 3, 4: 0}, adaptive_speculation=False)
    tokens, overlapped = run_counting_overlap(engine, batch, params)
    assert tokens == expected
    spec = engine.stats().spec
    assert overlapped > 0 and spec.steps_by_k.get(3, 0) > 0 and spec.num_accepted_tokens > 0
    assert_nothing_held(engine)


def test_adaptive_speculation_times_the_overlapped_steps(checkpoint):
    """Else k = 0 would never be timed while it overlaps, and stay the untried candidate."""
    engine = make_engine(checkpoint, overlap_scheduling=True, speculative_method="ngram",
                         speculation_schedule={1: 2}, adaptive_speculation=True)
    params = [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)] * 2
    _, overlapped = run_counting_overlap(engine, repetitive_prompts(2), params)
    buckets = engine.speculator.adaptive.buckets.values()
    assert overlapped > 0 and any(b.num_timed(0) > 0 for b in buckets)
    assert any(b.num_timed(k) > 0 for b in buckets for k in (1, 2))
    assert_nothing_held(engine)
