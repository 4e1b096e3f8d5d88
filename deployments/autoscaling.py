"""Scaling target replicas on engine load rather than on Serve's request count alone.

Each TargetModel replica returns `target_autoscaling_stats(engine.stats())` from its
`record_autoscaling_stats`; Serve averages each figure per replica over `look_back_period_s`
and hands them to `engine_load_policy` as `ctx.aggregated_metrics`. The policy wants

    replicas = max( sum over replicas of (waiting + running) / target_ongoing_requests,
                    current replicas x mean KV usage / target_kv_usage )

so a replica is added when the engines hold more requests than the target per replica, or
when their KV pools fill up (requests would start queueing or being preempted) even if the
request count looks fine. Until the replicas have reported, it falls back to the request
count Serve itself measures (`ctx.total_num_requests`).

Ray Serve 2.60 wraps every custom policy with `upscaling_factor` / `downscaling_factor`,
`upscale_delay_s` / `downscale_delay_s` and min/max bounds
(`ray.serve.autoscaling_policy._apply_autoscaling_config`), so this function answers only
"how many replicas does the load want", clipped to the bounds; applying the delays here too
would double them.

Configure it in `serve_config.yaml`:

    autoscaling_config:
      min_replicas: 1
      max_replicas: 4
      target_ongoing_requests: 32      # engine requests (waiting + running) per replica
      upscale_delay_s: 10
      downscale_delay_s: 120
      policy:
        policy_function: deployments.autoscaling:engine_load_policy
        # or, with a KV target other than 0.85:
        # policy_function: deployments.autoscaling:EngineLoadPolicy
        # policy_kwargs: {target_kv_usage: 0.9}

DraftModel replicas report `ONGOING_PROPOSALS`, the mean number of proposal calls in progress,
since engines call them directly (app/engine/spec/draft_channel.py) and Serve's own request
count misses those calls; `draft_load_policy` wants sum / target_ongoing_requests replicas.

Keep this module free of project imports: Serve pickles it by value to the controller.
"""

from __future__ import annotations

import math
from typing import Any

WAITING = "num_requests_waiting"
RUNNING = "num_requests_running"
KV_USAGE = "kv_cache_usage"
ONGOING_PROPOSALS = "ongoing_proposals"
DEFAULT_TARGET_KV_USAGE = 0.85


def target_autoscaling_stats(stats) -> dict[str, float]:
    """What `TargetModel.record_autoscaling_stats` returns for an `EngineStats`."""
    return {WAITING: float(stats.num_requests_waiting),
            RUNNING: float(stats.num_requests_running),
            KV_USAGE: float(stats.kv_cache_usage)}


def desired_replicas(ctx, target_kv_usage: float = DEFAULT_TARGET_KV_USAGE) -> float:
    """The replica count the engines' load asks for (unrounded, unbounded)."""
    current = ctx.current_num_replicas
    if current == 0:  # Serve's own cold-start path scales 0 -> 1 when requests arrive
        return ctx.target_num_replicas
    metrics = ctx.aggregated_metrics or {}
    by_load = _replicas_for_load(ctx, WAITING, RUNNING)
    kv = metrics.get(KV_USAGE, {})
    by_kv = current * (sum(kv.values()) / len(kv)) / target_kv_usage if kv else 0.0
    return max(by_load, by_kv)


def _replicas_for_load(ctx, *figures: str) -> float:
    """The sum of the replicas' `figures` over target_ongoing_requests; Serve's request count
    until a replica has reported them."""
    target_load = float(ctx.config.target_ongoing_requests or 1.0)
    metrics = ctx.aggregated_metrics or {}
    by_figure = [metrics.get(name, {}) for name in figures]
    reported = set().union(*by_figure)
    if not reported:
        return ctx.total_num_requests / target_load
    load = sum(sum(values.values()) for values in by_figure)
    # Replicas that have not reported yet carry the mean load of those that have.
    load *= max(ctx.current_num_replicas, len(reported)) / len(reported)
    return load / target_load


def _bounded(ctx, desired: float) -> int:
    lo, hi = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
    # A hair under an integer is that integer (4 requests / target 2 is 2 replicas, not 3).
    return max(lo, min(hi, math.ceil(desired - 1e-9)))


class EngineLoadPolicy:
    """The policy as a class, for `policy_kwargs` (Serve instantiates it once)."""

    def __init__(self, target_kv_usage: float = DEFAULT_TARGET_KV_USAGE):
        if not 0 < target_kv_usage <= 1:
            raise ValueError(f"target_kv_usage must be in (0, 1], got {target_kv_usage}")
        self.target_kv_usage = target_kv_usage

    def __call__(self, ctx) -> tuple[int, dict[str, Any]]:
        desired = desired_replicas(ctx, self.target_kv_usage)
        state = dict(ctx.policy_state or {})
        state["engine_load_desired"] = desired
        return _bounded(ctx, desired), state


def engine_load_policy(ctx) -> tuple[int, dict[str, Any]]:
    """Ray Serve custom autoscaling policy for TargetModel (KV target 0.85)."""
    return EngineLoadPolicy()(ctx)


def draft_load_policy(ctx) -> tuple[int, dict[str, Any]]:
    """Ray Serve custom autoscaling policy for DraftModel: the proposal calls its replicas count."""
    state = dict(ctx.policy_state or {})
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, state
    desired = _replicas_for_load(ctx, ONGOING_PROPOSALS)
    state["draft_load_desired"] = desired
    return _bounded(ctx, desired), state
