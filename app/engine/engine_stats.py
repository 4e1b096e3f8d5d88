"""What one engine reports each step: its load, its KV pool and prefix cache, and cumulative
counters. The front, the metrics and the autoscaling policies read it (one name from engine to
Prometheus)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.engine.spec.speculator import SpecStats


@dataclass
class EngineStats:
    num_requests_running: int
    num_requests_waiting: int
    num_blocks_total: int
    num_blocks_used: int
    kv_cache_usage: float  # fraction of blocks referenced by a request
    prefix_cache_queries: int  # tokens, cumulative
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int  # prompt tokens computed (cache hits excluded), cumulative
    generation_tokens: int
    num_steps: int
    spec: SpecStats = field(default_factory=SpecStats)
