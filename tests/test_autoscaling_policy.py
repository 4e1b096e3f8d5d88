"""The engine-load autoscaling policy on synthetic contexts, alone and wrapped as Ray Serve 2.60
wraps it in the controller (scaling factors, delays, bounds)."""

from __future__ import annotations

import pytest
from ray.serve import autoscaling_policy as ray_policy
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from deployments.autoscaling import (KV_USAGE, ONGOING_PROPOSALS, RUNNING, WAITING, EngineLoadPolicy,
                                     draft_load_policy, engine_load_policy, target_autoscaling_stats)
from deployments.draft import ProposalLoad
from app.engine.engine_stats import EngineStats


def stats(**kw) -> EngineStats:
    base = dict(num_requests_running=0, num_requests_waiting=0, num_blocks_total=64,
                num_blocks_used=0, kv_cache_usage=0.0, prefix_cache_queries=0,
                prefix_cache_hits=0, num_preemptions=0, prompt_tokens=0, generation_tokens=0,
                num_steps=0)
    return EngineStats(**{**base, **kw})


def context(replicas: dict[str, tuple[float, float, float]], config: AutoscalingConfig,
            target: int | None = None, total_requests: float = 0.0, state=None) -> AutoscalingContext:
    """`replicas`: replica id → (waiting, running, kv usage) as Serve would aggregate them."""
    metrics = {WAITING: {r: v[0] for r, v in replicas.items()},
               RUNNING: {r: v[1] for r, v in replicas.items()},
               KV_USAGE: {r: v[2] for r, v in replicas.items()}} if replicas else {}
    n = len(replicas)
    return AutoscalingContext(
        deployment_id=None, deployment_name="TargetModel", app_name="default",
        current_num_replicas=n, target_num_replicas=n if target is None else target,
        running_replicas=list(replicas), total_num_requests=total_requests,
        total_queued_requests=0.0, aggregated_metrics=metrics, raw_metrics=None,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas, policy_state=state or {},
        last_scale_up_time=None, last_scale_down_time=None, current_time=None, config=config)


def cfg(**kw) -> AutoscalingConfig:
    base = dict(min_replicas=1, max_replicas=3, target_ongoing_requests=4,
                upscale_delay_s=0, downscale_delay_s=0)
    return AutoscalingConfig(**{**base, **kw})


def decide(ctx) -> int:
    return engine_load_policy(ctx)[0]


def test_stats_for_record_autoscaling_stats():
    out = target_autoscaling_stats(stats(num_requests_waiting=2, num_requests_running=5,
                                         kv_cache_usage=0.5))
    assert out == {WAITING: 2.0, RUNNING: 5.0, KV_USAGE: 0.5}
    assert all(isinstance(v, float) for v in out.values())  # what Serve's validation wants


def test_scales_up_on_load_and_down_when_idle():
    c = cfg()
    assert decide(context({"a": (0, 4, 0.2)}, c)) == 1          # at target: stay
    assert decide(context({"a": (3, 4, 0.2)}, c)) == 2          # 7 requests, target 4
    assert decide(context({"a": (0, 3, 0.1), "b": (0, 2, 0.1)}, c)) == 2
    assert decide(context({"a": (0, 1, 0.1), "b": (0, 0, 0.0)}, c)) == 1
    assert decide(context({"a": (0, 0, 0.0), "b": (0, 0, 0.0)}, c)) == 1


def test_kv_pressure_scales_up_with_few_requests():
    assert decide(context({"a": (0, 2, 0.99)}, cfg())) == 2


def test_respects_min_and_max():
    assert decide(context({"a": (50, 50, 1.0)}, cfg(max_replicas=3))) == 3
    assert decide(context({"a": (0, 0, 0.0), "b": (0, 0, 0.0)}, cfg(min_replicas=2))) == 2


def test_falls_back_to_serve_request_count_before_reports():
    c = cfg()
    ctx = context({}, c, total_requests=12)
    ctx.current_num_replicas, ctx.target_num_replicas, ctx.running_replicas = 1, 1, ["a"]
    assert decide(ctx) == 3


def test_unreported_replica_counts_as_average():
    c = cfg(max_replicas=5)
    ctx = context({"a": (0, 8, 0.1)}, c)
    ctx.current_num_replicas = 2  # "b" is running but has not reported yet
    assert decide(ctx) == 4  # 2 x 8 requests / 4


def test_policy_class_takes_kwargs():
    assert EngineLoadPolicy(target_kv_usage=0.5)(context({"a": (0, 1, 0.6)}, cfg()))[0] == 2
    with pytest.raises(ValueError):
        EngineLoadPolicy(target_kv_usage=0)


def test_serve_wrapper_applies_delays(monkeypatch):
    """Ray 2.60 wraps a custom policy with the config's delays: 1 -> 2 only after
    upscale_delay_s of sustained load, 2 -> 1 only after downscale_delay_s of idleness."""
    now = [0.0]
    monkeypatch.setattr(ray_policy.time, "time", lambda: now[0])
    wrapped = ray_policy._apply_autoscaling_config(engine_load_policy)
    c = cfg(upscale_delay_s=5, downscale_delay_s=20)
    state: dict = {}

    def step(replicas, target, dt):
        nonlocal state
        now[0] += dt
        n, state = wrapped(context(replicas, c, target=target, state=state))
        return n

    busy, idle = (6, 4, 0.5), (0, 0, 0.0)
    assert step({"a": busy}, 1, 0) == 1       # wants 3 (10 / 4) but the delay holds it
    assert step({"a": busy}, 1, 4) == 1
    assert step({"a": busy}, 1, 1.5) == 3
    three_idle = {"a": idle, "b": idle, "c": idle}
    assert step(three_idle, 3, 1) == 3
    assert step(three_idle, 3, 10) == 3
    # Load back at 3 replicas' worth in the middle of the wait restarts the downscale timer.
    assert step({"a": busy, "b": busy, "c": idle}, 3, 1) == 3
    assert step(three_idle, 3, 1) == 3
    assert step(three_idle, 3, 15) == 3
    assert step(three_idle, 3, 6) == 1
    assert "engine_load_desired" in state


def draft_context(ongoing: dict[str, float], config: AutoscalingConfig, total_requests: float = 0.0):
    """`ongoing`: replica id → mean proposal calls in progress, as DraftModel replicas report."""
    ctx = context({r: (0, 0, 0.0) for r in ongoing}, config, total_requests=total_requests)
    ctx.aggregated_metrics = {ONGOING_PROPOSALS: ongoing} if ongoing else {}
    return ctx


def test_draft_replicas_follow_the_proposal_calls_they_count_direct_ones_included():
    c = cfg(target_ongoing_requests=2)
    assert draft_load_policy(draft_context({"a": 1.5}, c))[0] == 1
    assert draft_load_policy(draft_context({"a": 3.2}, c))[0] == 2  # Serve itself saw no request
    assert draft_load_policy(draft_context({"a": 0.3, "b": 0.4}, c))[0] == 1
    before_reports = draft_context({}, c, total_requests=5)
    before_reports.current_num_replicas = 1
    assert draft_load_policy(before_reports)[0] == 3  # Serve's count until replicas report


def test_proposal_load_is_the_time_mean_of_calls_in_progress(monkeypatch):
    import deployments.draft as draft

    now = [100.0]
    monkeypatch.setattr(draft.time, "monotonic", lambda: now[0])
    load = ProposalLoad()
    load.begin()                 # one call for the whole second,
    now[0] += 0.5
    load.begin()                 # a second one for its last half
    now[0] += 0.5
    assert load.read() == pytest.approx(1.5)
    load.end()
    load.end()
    now[0] += 1.0
    assert load.read() == pytest.approx(0.0)
