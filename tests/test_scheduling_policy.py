"""vLLM's scheduling policies: "fcfs" serves requests in arrival order and preempts the newest;
"priority" takes waiting requests by (priority, arrival), lower first, and preempts the running
request last in that order."""

from __future__ import annotations

import pytest

from app.config import EngineConfig
from app.engine.block_manager import BlockManager
from app.engine.engine import LLMEngine
from app.engine.request import Request
from app.engine.scheduler import Scheduler
from app.outputs import RequestRejected
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_TARGET


def request(rid: str, priority: int = 0, tokens: int = 8) -> Request:
    return Request(rid, list(range(tokens)), SamplingParams(max_tokens=8, priority=priority))


def test_waiting_requests_are_taken_by_priority_then_arrival():
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=64, policy="priority")
    for rid, priority in (("late-low", 5), ("first-high", -1), ("second-high", -1), ("mid", 0)):
        scheduler.add(request(rid, priority))
    assert [r.request_id for r in scheduler.waiting] == ["first-high", "second-high", "mid", "late-low"]
    out = scheduler.schedule()
    assert [r.request_id for r in out.num_scheduled_tokens] == ["first-high", "second-high"]


def test_the_lowest_priority_running_request_is_preempted_and_queued_by_its_rank():
    bm = BlockManager(6, 4)  # 24 token slots: three 8-token prompts fill it
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, policy="priority")
    low, high, mid = request("low", 3), request("high", 0), request("mid", 1)
    for r in (low, high, mid):
        scheduler.add(r)
    scheduler.schedule()
    for r in scheduler.running:
        r.num_computed_tokens = r.num_tokens
        r.append_token(1)  # each now needs a ninth slot: a new block none is free for
    scheduler.add(request("waiting", 2))
    out = scheduler.schedule()
    assert out.preempted == [low]  # not the newest (mid): the lowest priority
    assert [r.request_id for r in scheduler.waiting] == ["waiting", "low"]


def test_fcfs_preempts_the_newest_and_requeues_it_first():
    bm = BlockManager(6, 4)
    scheduler = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    first, second, third = request("a"), request("b"), request("c")
    for r in (first, second, third):
        scheduler.add(r)
    scheduler.schedule()
    for r in scheduler.running:
        r.num_computed_tokens = r.num_tokens
        r.append_token(1)
    scheduler.add(request("d"))
    out = scheduler.schedule()
    assert out.preempted == [third] and scheduler.waiting[0] is third


def test_a_beam_forked_from_a_waiting_beam_waits_at_its_parents_rank():
    """A beam forked after its parent was preempted queues as its parent does: by rank under
    "priority", not ahead of more urgent requests; first under "fcfs"."""
    for policy, expected in (("priority", ["urgent", "parent", "fork", "later"]),
                             ("fcfs", ["fork", "urgent", "parent", "later"])):
        scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=64, policy=policy)
        parent = request("parent", priority=1)
        for r in (request("urgent", priority=0), parent, request("later", priority=2)):
            scheduler.add(r)
        scheduler.add_fork(parent, request("fork", priority=1))
        assert [r.request_id for r in scheduler.waiting] == expected, policy


def test_a_beam_forked_from_a_running_beam_runs_beside_it():
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=64, policy="priority")
    parent = request("parent")
    scheduler.add(parent)
    scheduler.schedule()
    fork = request("fork")
    scheduler.add_fork(parent, fork)
    assert scheduler.running == [parent, fork] and fork.status == parent.status


def test_an_engine_under_priority_finishes_the_urgent_request_first_and_fcfs_refuses_priorities():
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64, max_num_seqs=1,
                                    scheduling_policy="priority"))
    params = dict(max_tokens=6, temperature=0, ignore_eos=True)
    engine.add_request("background", [1, 2, 3], SamplingParams(**params, priority=10))
    engine.add_request("urgent", [4, 5, 6], SamplingParams(**params, priority=-10))
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["urgent", "background"]
    fcfs = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64))
    with pytest.raises(RequestRejected, match="priority"):
        fcfs.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2, priority=1))
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineConfig(model=str(DEFAULT_TARGET), scheduling_policy="lifo")
