"""The prefix-aware routing rule (deployments/prefix_routing.py) on replica views built from
the reports replicas send, without Serve: the served behaviour is tests/serve/test_prefix_routing_served.py."""

from __future__ import annotations

import pytest

from app.engine.block_manager import block_hashes
from deployments.prefix_routing import KV_FULL, ReplicaView, RoutingStats, pack_hashes, rank_replicas

BLOCK = 16
SYSTEM = list(range(100, 300))  # a 200-token shared prefix: 12 full blocks
OTHER = list(range(1000, 1200))


def report(cached_prompts=(), running=0, queued=0, in_transit=0, max_num_seqs=8, kv=0.1, at=1.0) -> RoutingStats:
    """`queued`: requests the engine's last step could not admit; `in_transit`: requests
    accepted since, not yet seen by a step. Both count as waiting."""
    hashes = [h for p in cached_prompts for h in block_hashes(p, BLOCK)]
    return RoutingStats(BLOCK, pack_hashes(hashes), running, queued + in_transit, queued, max_num_seqs, kv, at)


def view(name, stats=None) -> ReplicaView:
    v = ReplicaView(name)
    if stats is not None:
        v.take_report(stats)
    return v


def chosen(prompt, views, **kwargs) -> tuple[str, str]:
    decision = rank_replicas(block_hashes(prompt, BLOCK), views, **kwargs)
    return decision.ranked[0].replica_id, decision.reason


def test_the_replica_holding_the_longest_prefix_wins():
    a = view("a", report([OTHER]))
    b = view("b", report([SYSTEM[:64]]))
    c = view("c", report([SYSTEM]))
    for _ in range(20):
        assert chosen(SYSTEM + [7, 8, 9], [a, b, c]) == ("c", "prefix")


def test_a_multi_turn_prompt_goes_back_to_the_replica_that_holds_the_previous_turn():
    turn1 = SYSTEM + list(range(2000, 2040))
    answer = list(range(3000, 3030))
    turn2 = turn1 + answer + list(range(4000, 4020))
    a, b = view("a", report([turn1 + answer])), view("b", report([SYSTEM]))
    assert chosen(turn2, [a, b]) == ("a", "prefix")


def test_without_any_cached_prefix_the_least_loaded_replica_wins():
    a, b = view("a", report(running=5)), view("b", report(running=1))
    assert chosen(SYSTEM, [a, b]) == ("b", "no_prefix")


@pytest.mark.parametrize("busy", [dict(queued=1), dict(running=8), dict(kv=KV_FULL)])
def test_a_replica_that_would_queue_is_passed_over_while_another_is_idle(busy):
    holder = view("holder", report([SYSTEM], **busy))
    idle = view("idle", report())
    name, reason = chosen(SYSTEM, [holder, idle])
    assert (name, reason) == ("idle", "load")


def test_requests_on_their_way_into_the_holder_count_as_load_not_as_a_queue():
    """A report taken while two requests were on their way into the holder's engine (accepted,
    not yet seen by a step): the next turn of a conversation it holds still goes there, though
    another replica is idle. Counted as queued, they turned such turns away (RESULTS.md, 2026-11-27)."""
    holder = view("holder", report([SYSTEM], running=1, in_transit=2))
    idle = view("idle", report())
    assert holder.load == 3 and not holder.would_queue
    assert chosen(SYSTEM + [1, 2, 3], [holder, idle]) == ("holder", "prefix")
    holder.take_report(report([SYSTEM], running=1, queued=1, in_transit=1, at=2.0))
    assert holder.would_queue
    assert chosen(SYSTEM + [1, 2, 3], [holder, idle]) == ("idle", "load")


def test_when_every_replica_would_queue_though_one_is_idle_a_replica_is_still_chosen():
    # Its report says the pool is full; its requests have ended since. Serve's router gives up on
    # a request whose choice raises, and the request then hangs (CI, 2026-11-25).
    lone = view("lone", report([SYSTEM], kv=KV_FULL))
    assert lone.load == 0 and lone.would_queue
    assert chosen(SYSTEM, [lone]) == ("lone", "prefix")
    busy = view("busy", report(queued=2))
    assert chosen(OTHER, [lone, busy])[0] == "lone"


@pytest.mark.parametrize("other_load", [dict(queued=1), dict(running=2)])
def test_when_no_replica_is_idle_the_cache_decides_even_for_a_queueing_holder(other_load):
    holder = view("holder", report([SYSTEM], queued=3))
    other = view("other", report(**other_load))
    assert chosen(SYSTEM, [holder, other]) == ("holder", "prefix")


def test_a_holder_loaded_beyond_the_imbalance_loses_to_the_least_loaded():
    holder = view("holder", report([SYSTEM], running=7, max_num_seqs=64))
    light = view("light", report(running=1, max_num_seqs=64))
    assert chosen(SYSTEM, [holder, light], max_load_imbalance=8) == ("holder", "prefix")
    assert chosen(SYSTEM, [holder, light], max_load_imbalance=4) == ("light", "load")


def test_prefixes_sent_since_the_last_report_count_until_forgotten():
    """A burst that shares a new prefix stays together before any report shows it."""
    a, b = view("a", report()), view("b", report())
    first, _ = chosen(SYSTEM, [a, b])
    sent_to = a if first == "a" else b
    sent_to.record_sent("r1", block_hashes(SYSTEM, BLOCK), now=10.0, remember_s=2.0)
    assert chosen(SYSTEM + [5], [a, b]) == (first, "prefix")
    assert sent_to.load == 1  # counted while open
    sent_to.record_sent("r2", [], now=13.0, remember_s=2.0)  # later: the prefix was forgotten
    assert sent_to.matched_blocks(block_hashes(SYSTEM, BLOCK)) == 0
    sent_to.record_ended("r2")
    assert sent_to.load == 1
    sent_to.take_report(report(at=11.0))  # the report counts r1 (sent before it) itself
    assert sent_to.load == 0


def test_requests_sent_after_the_report_count_until_they_end_and_fill_the_sequence_slots():
    v = view("a", report([SYSTEM], running=2, max_num_seqs=4, at=5.0))
    v.record_sent("x", [], now=6.0, remember_s=2.0)
    assert v.load == 3 and not v.would_queue
    v.record_sent("y", [], now=6.1, remember_s=2.0)
    assert v.would_queue
    v.record_ended("y")
    assert v.load == 3 and not v.would_queue


def test_a_report_taken_while_the_last_turn_waited_does_not_turn_the_next_turn_away():
    """The previous turn was sent, counted as queued by the holder's report, and has ended:
    until the next report, the holder is idle again, and the next turn goes back to it."""
    holder, idle = view("holder", report(max_num_seqs=4, at=1.0)), view("idle", report(max_num_seqs=4))
    holder.record_sent("turn1", block_hashes(SYSTEM, BLOCK), now=2.0, remember_s=2.0)
    holder.take_report(report([SYSTEM], queued=1, max_num_seqs=4, at=2.5))
    assert holder.would_queue and holder.load == 1
    holder.record_ended("turn1")
    assert not holder.would_queue and holder.load == 0
    assert chosen(SYSTEM + [1, 2, 3], [holder, idle]) == ("holder", "prefix")
    holder.take_report(report([SYSTEM], queued=1, max_num_seqs=4, at=3.0))  # a new report is the truth again
    assert holder.would_queue


def test_an_end_counts_against_the_report_once_and_only_for_requests_it_counted():
    v = view("a", report(running=1, max_num_seqs=4, at=1.0))
    v.record_sent("counted", [], now=2.0, remember_s=2.0)
    v.take_report(report(running=3, max_num_seqs=4, at=3.0))  # "counted" and two from other routers
    v.record_sent("after", [], now=4.0, remember_s=2.0)
    assert v.load == 4 and v.would_queue
    v.record_ended("counted")
    v.record_ended("counted")
    v.record_ended("after")
    v.record_ended("unknown")
    assert v.load == 2 and not v.would_queue


def test_an_older_report_never_replaces_a_newer_one():
    v = view("a", report([SYSTEM], at=5.0))
    v.take_report(report(at=4.0))
    assert v.matched_blocks(block_hashes(SYSTEM, BLOCK)) == 12


def test_the_others_follow_least_loaded_first_and_a_replica_without_a_report_is_a_candidate():
    views = [view("heavy", report(running=6)), view("new"), view("light", report(running=2))]
    decision = rank_replicas(block_hashes(SYSTEM, BLOCK), views)
    assert [v.replica_id for v in decision.ranked] == ["new", "light", "heavy"]


def test_stats_round_trip_through_serve_s_dict_and_a_foreign_dict_is_no_report():
    stats = report([SYSTEM], running=2)
    assert RoutingStats.from_dict(stats.to_dict()) == stats
    assert stats.block_hashes == block_hashes(SYSTEM, BLOCK)  # 64-bit hashes survive the packing
    assert RoutingStats.from_dict({}) is None
    assert RoutingStats.from_dict({"queue": 3}) is None


def test_a_prefix_no_replica_holds_goes_where_the_least_new_content_went_lately():
    a, b = view("a", report(running=1)), view("b", report(running=4))
    a.record_sent("r1", block_hashes(OTHER, BLOCK), now=100.0, remember_s=4.0)  # 12 blocks new to a
    assert a.recent_new_blocks == 12 and b.recent_new_blocks == 0
    assert a.load == 2 and b.load == 4
    assert chosen(SYSTEM, [a, b]) == ("b", "no_prefix")  # b is busier, but its cache got nothing new
    a.record_sent("r2", block_hashes(OTHER + [5] * 16, BLOCK), now=101.0, remember_s=4.0)
    assert a.recent_new_blocks == 13  # it held OTHER's 12 blocks already (sent): one new
    a.forget_sends_before(100.5)
    assert a.recent_new_blocks == 1
    a.forget_sends_before(200.0)
    assert a.recent_new_blocks == 0 and chosen(SYSTEM, [a, b]) == ("a", "no_prefix")  # then by load (3 < 4)


def test_room_for_a_new_prefix_does_not_outweigh_a_long_queue():
    a, b = view("a", report(running=1)), view("b", report(running=11))
    a.record_sent("r1", block_hashes(OTHER, BLOCK), now=100.0, remember_s=4.0)
    assert a.load == 2  # b carries 9 more than a: past max_load_imbalance
    assert chosen(SYSTEM, [a, b], max_load_imbalance=8) == ("a", "no_prefix")
    assert chosen(SYSTEM, [a, b], max_load_imbalance=9) == ("b", "no_prefix")


def test_the_router_reads_a_generate_calls_prompt_and_cache_salt():
    """What `PrefixAwareRouter` hashes: the call's prompt from a salted root (the pool's rule)."""
    from types import SimpleNamespace

    from deployments.prefix_router import cache_salt_of, prompt_of

    def call(*args, method="generate", **kwargs):
        return SimpleNamespace(metadata=SimpleNamespace(call_method=method), args=args, kwargs=kwargs)

    assert (prompt_of(call("r", [1, 2], {"cache_salt": "s"})), cache_salt_of(call("r", [1, 2], {"cache_salt": "s"}))) \
        == ([1, 2], "s")
    assert cache_salt_of(call("r", [1, 2], {"max_tokens": 3})) is None
    assert cache_salt_of(call("r", prompt_token_ids=[1], params={"cache_salt": "k"})) == "k"
    assert cache_salt_of(None) is None and prompt_of(call(method="stats")) is None


def test_the_routers_figures_show_each_live_replicas_load_as_it_ranks_them():
    """`specserve:router_replica_load{target}`: the load the rule reads (a report's requests, less
    those ended since, plus those sent since), and no series for a replica that is gone."""
    from deployments.prefix_router import RoutingCollector, RoutingFigures

    figures = RoutingFigures()
    busy, idle = view("a", report(running=2, at=1.0)), view("b")
    busy.record_sent("r1", block_hashes(SYSTEM, BLOCK), now=2.0, remember_s=2.0)
    for v in (busy, idle):
        figures.show(v)

    def loads() -> dict[str, float]:
        [family] = [f for f in RoutingCollector("m", "ingress-1", figures).collect()
                    if f.name == "specserve:router_replica_load"]
        return {s.labels["target"]: s.value for s in family.samples}

    assert loads() == {"a": 3, "b": 0} and figures.cached_blocks == {"a": 0}  # b has sent no report
    busy.record_ended("r1")
    figures.show(busy)
    assert loads() == {"a": 2, "b": 0}
    figures.forget("a")
    assert loads() == {"b": 0} and figures.cached_blocks == {}


def test_the_router_moves_a_retried_requests_load_to_its_new_choice():
    """`PrefixAwareRouter.choose_replicas` without Serve: a request counts on the replica it was sent
    to until it ends, and a retry (Serve's, the same internal id) takes it from the first choice."""
    import asyncio
    from collections import namedtuple
    from types import SimpleNamespace

    from deployments.prefix_router import PrefixAwareRouter, RoutingFigures

    ReplicaId = namedtuple("ReplicaId", "unique_id")
    holder = SimpleNamespace(replica_id=ReplicaId("a"), routing_stats=report([SYSTEM], at=1.0).to_dict())
    other = SimpleNamespace(replica_id=ReplicaId("b"), routing_stats=report(at=1.0).to_dict())
    router = PrefixAwareRouter.__new__(PrefixAwareRouter)
    router.initialize_state(block_size=BLOCK)
    router.figures = RoutingFigures()

    def choose(candidates, request_id="r1") -> list[str]:
        request = SimpleNamespace(metadata=SimpleNamespace(call_method="generate", internal_request_id=request_id),
                                  args=(request_id, SYSTEM + [7], {}), kwargs={})
        ranks = asyncio.run(router.choose_replicas(candidates, request))
        return [r.replica_id.unique_id for [r] in ranks]

    assert choose([holder, other]) == ["a"]  # the first try: the holder alone
    assert router.figures.loads == {"a": 1, "b": 0} and router.figures.requests["prefix"] == 1
    assert choose([other]) == ["b"]  # Serve retried r1 elsewhere
    assert router.figures.loads == {"a": 0, "b": 1}
    assert choose([holder, other], "r2") == ["a"]
    assert router.figures.loads == {"a": 1, "b": 1}
    router.on_request_completed(ReplicaId("b"), "r1")
    assert router.figures.loads == {"a": 1, "b": 0}
