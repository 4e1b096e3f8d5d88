"""The metrics pieces without Serve: the hub used as a plain class, the ingress timers and the
engine reporter, checked through prometheus_client's own parser."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.engine.engine_stats import EngineStats
from deployments import engine_metrics as em
from deployments import metrics as m

Hub = m.MetricsHub.func_or_class
MODEL = "tiny"


def parse(text: str) -> dict[str, list]:
    """Family name → samples; fails on a family that appears twice."""
    families = {}
    for fam in text_string_to_metric_families(text):
        assert fam.name not in families, f"duplicate family {fam.name}"
        families[fam.name] = fam.samples
    return families


def values(families, sample_name: str, **labels) -> list[float]:
    return [s.value for fams in families.values() for s in fams
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())]


def stats(**kw) -> EngineStats:
    base = EngineStats(num_requests_running=0, num_requests_waiting=0, num_blocks_total=64,
                       num_blocks_used=0, kv_cache_usage=0.0, prefix_cache_queries=0,
                       prefix_cache_hits=0, num_preemptions=0, prompt_tokens=0,
                       generation_tokens=0, num_steps=0)
    return replace(base, **kw)


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def run(coro):
    return asyncio.run(coro)


def test_ingress_counters_and_histograms_move():
    hub = Hub()
    ingress = m.IngressMetrics(hub, MODEL)
    clock = FakeClock()
    timer = m.RequestTimer(ingress, 5, clock=clock)
    clock.t += 0.2
    timer.on_tokens(1)          # TTFT 0.2
    clock.t += 0.05
    timer.on_tokens(2)          # one ITL observation of 0.05 for a 2-token chunk
    clock.t += 0.05
    timer.on_tokens(1)
    timer.on_finish("length", 5, 4)
    timer.on_finish("length", 5, 4)  # a second call changes nothing
    aborted = ingress.start_request(3)
    aborted.on_finish(None, 3, 0)

    fams = parse(run(ingress.render()))
    assert values(fams, "specserve:prompt_tokens_total") == [8]
    assert values(fams, "specserve:generation_tokens_total") == [4]
    assert values(fams, "specserve:request_success_total", finished_reason="length") == [1]
    assert values(fams, "specserve:request_success_total", finished_reason="abort") == [1]
    assert values(fams, "specserve:request_success_total", finished_reason="stop") == [0]
    assert values(fams, "specserve:time_to_first_token_seconds_count") == [1]
    assert values(fams, "specserve:time_to_first_token_seconds_sum") == [pytest.approx(0.2)]
    assert values(fams, "specserve:inter_token_latency_seconds_count") == [2]
    assert values(fams, "specserve:e2e_request_latency_seconds_count") == [2]
    # TPOT: (0.3 - 0.2) / (4 - 1)
    assert values(fams, "specserve:request_time_per_output_token_seconds_sum") == [
        pytest.approx(0.1 / 3)]
    # Every ingress series names its model and replica; the hub counts the ingress replica.
    assert all(s.labels["model_name"] == MODEL and s.labels["replica"] == ingress.replica
               for s in fams["specserve:prompt_tokens"])
    assert values(fams, "specserve:num_replicas", deployment="Ingress") == [1]
    assert not any(name.endswith("_created") for name in fams)


def test_two_target_replicas_and_ingress_in_one_exposition():
    hub = Hub()
    r1 = em.EngineMetricsReporter(hub, "r1", MODEL, lambda: stats(
        num_requests_running=3, num_requests_waiting=1, kv_cache_usage=0.5, num_preemptions=2,
        prefix_cache_queries=100, prefix_cache_hits=40))
    r2 = em.EngineMetricsReporter(hub, "r2", MODEL, lambda: stats(kv_cache_usage=0.25))
    ingress = m.IngressMetrics(hub, MODEL)

    async def go():
        await r1.report()
        await r2.report()
        return await ingress.render()

    fams = parse(run(go()))
    usage = {s.labels["replica"]: s.value for s in fams["specserve:kv_cache_usage_perc"]}
    assert usage == {"r1": 0.5, "r2": 0.25}
    assert values(fams, "specserve:num_requests_running", replica="r1") == [3]
    assert values(fams, "specserve:num_requests_waiting", replica="r1") == [1]
    assert values(fams, "specserve:num_preemptions_total", replica="r1") == [2]
    assert values(fams, "specserve:prefix_cache_hits_total", replica="r1") == [40]
    assert values(fams, "specserve:prefix_cache_queries_total", replica="r2") == [0]
    assert values(fams, "specserve:num_replicas", deployment="TargetModel") == [2]
    assert "specserve:time_to_first_token_seconds" in fams


def test_stale_and_removed_sources_are_dropped(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(m.time, "monotonic", lambda: now[0])
    hub = Hub(stale_after_s=30)
    old = em.EngineMetricsReporter(hub, "old", MODEL, lambda: stats(kv_cache_usage=0.9))
    new = em.EngineMetricsReporter(hub, "new", MODEL, lambda: stats(kv_cache_usage=0.1))
    run(old.report())
    now[0] += 25
    run(new.report())
    now[0] += 10  # old last heard 35 s ago, new 10 s ago
    fams = parse(run(hub.render()))
    assert [s.labels["replica"] for s in fams["specserve:kv_cache_usage_perc"]] == ["new"]
    run(hub.remove(new.source))
    assert "specserve:kv_cache_usage_perc" not in parse(run(hub.render()))


def test_reporter_background_task_reports_and_stops():
    hub = Hub()
    counter = {"calls": 0}

    def get_stats():
        counter["calls"] += 1
        return stats(num_requests_running=counter["calls"])

    async def go():
        reporter = em.EngineMetricsReporter(hub, "r1", MODEL, get_stats, interval_s=0.01)
        reporter.start()
        await asyncio.sleep(0.1)
        running = parse(await hub.render())["specserve:num_requests_running"]
        reporter.stop()
        await asyncio.sleep(0.02)  # the remove scheduled by stop() runs
        return running, counter["calls"], parse(await hub.render())

    running, calls, after = run(go())
    assert calls >= 3 and running[0].value >= 2
    assert "specserve:num_requests_running" not in after


def test_conflicting_and_duplicate_series_still_render_valid_text():
    fam = {"name": "specserve:x", "type": "gauge", "help": "x",
           "samples": [["specserve:x", {"replica": "a"}, 1.0]]}
    hub = Hub()
    run(hub.report({"deployment": "A", "replica": "1"}, [fam]))
    run(hub.report({"deployment": "A", "replica": "2"}, [fam]))  # same series twice: summed
    run(hub.report({"deployment": "B", "replica": "1"}, [dict(fam, type="counter")]))
    fams = parse(run(hub.render()))
    assert values(fams, "specserve:x") == [2.0]


def test_ingress_without_hub_renders_itself():
    ingress = m.IngressMetrics(None, MODEL)
    ingress.start_request(2).on_finish("stop", 2, 0)
    fams = parse(run(ingress.render()))
    assert values(fams, "specserve:request_success_total", finished_reason="stop") == [1]


def test_speculative_decoding_metrics_with_vllm_names():
    from app.engine.spec.speculator import SpecStats

    spec = SpecStats()
    spec.record(4, 4)
    spec.record(4, 1)
    spec.record(2, 0)
    spec.num_proposer_failures = 2
    spec.steps_by_k = {0: 7, 4: 3}
    spec.num_proposals, spec.proposal_seconds = 3, 0.25
    spec.num_drafts_sent_ahead, spec.num_drafts_ahead_used = 5, 2
    spec.num_drafts_looked_up = 4
    spec.num_drafts_from_recent_outputs = 3
    spec.num_drafts_from_prediction = 6
    hub = Hub()
    reporter = em.EngineMetricsReporter(hub, "r1", MODEL, lambda: stats(spec=spec))
    run(reporter.report())
    fams = parse(run(hub.render()))
    assert values(fams, "specserve:spec_decode_num_drafts_total") == [3]
    assert values(fams, "specserve:spec_decode_num_draft_tokens_total") == [10]
    assert values(fams, "specserve:spec_decode_num_accepted_tokens_total") == [5]
    per_pos = {s.labels["position"]: s.value for s in fams["specserve:spec_decode_num_accepted_tokens_per_pos"]}
    assert per_pos == {"0": 2, "1": 1, "2": 1, "3": 1}
    assert values(fams, "specserve:spec_decode_draft_acceptance_rate") == [pytest.approx(0.5)]
    assert values(fams, "specserve:spec_decode_mean_accepted_length") == [pytest.approx(1 + 5 / 3)]
    assert values(fams, "specserve:spec_decode_num_proposer_failures_total") == [2]
    by_k = {s.labels["k"]: s.value for s in fams["specserve:spec_decode_steps"]}
    assert by_k == {"0": 7, "4": 3}
    assert values(fams, "specserve:spec_decode_proposals_total") == [3]
    assert values(fams, "specserve:spec_decode_proposal_seconds_total") == [0.25]
    assert values(fams, "specserve:spec_decode_drafts_sent_ahead_total") == [5]
    assert values(fams, "specserve:spec_decode_drafts_ahead_used_total") == [2]
    assert values(fams, "specserve:spec_decode_drafts_looked_up_total") == [4]
    assert values(fams, "specserve:spec_decode_drafts_from_recent_outputs_total") == [3]
    assert values(fams, "specserve:spec_decode_drafts_from_prediction_total") == [6]
