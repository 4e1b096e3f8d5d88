"""TargetModel: one engine per replica; many requests in flight, batched by the engine.

The engine runs in a process of its own, started by the replica (app/engine/engine_process.py):
the replica's event loop streams chunks while the engine steps, without the two taking turns on
one GIL. The engine calls a DraftModel replica directly for its drafts; the replica holds the
DraftModel handle through which the engine finds that replica, and proposes through it while
there is none (app/engine/spec/draft_channel.py). The replica fails its health check if the
engine process dies.

A guided request carries its `OutputFormat` in `params["output_format"]`. The replica gets the
format's compiled index from the ConstraintService, through the handle `build_app` binds here,
and keeps the indexes it fetched (`GuidedIndexStore`, deployments/guided_client.py); the engine
front sends each index to the engine process once. A format the service cannot compile is
raised from `generate` before its first output: the ingress answers 400 (503 when the compiler
is busy).

`generate` streams one item per engine step that produced tokens for the request (one hop per
chunk to the ingress). Closing or cancelling the stream on the caller's side cancels this
method, which closes the engine's generator, which aborts the request and frees its KV blocks
before the next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from typing import AsyncIterator

from ray import serve

from app.config import EngineConfig
from app.engine.async_engine import AsyncLLMEngine
from app.engine.engine_process import EngineProcess
from app.engine.front_config import FrontConfig
from app.engine.spec.draft_channel import DirectDraftProposer
from app.outputs import RequestOutput
from app.sampling_params import SamplingParams
from deployments.autoscaling import target_autoscaling_stats
from deployments.draft import DraftClient
from deployments.guided_client import GuidedIndexStore
from deployments.engine_metrics import EngineMetricsReporter
from deployments.prefix_routing import MAX_REPORTED_BLOCKS, RoutingStats, pack_hashes
from deployments.worker_niceness import NORMAL_PRIORITY_RUNTIME_ENV

logger = logging.getLogger("ray.serve")
# With `engine_process: false` only (the engine as a thread of the replica).
# Measured at concurrency 8 on 2 CPU cores (benchmarks/RESULTS.md), while the engine thread
# still ran at Ray's niceness 15: Serve overhead 1.39-1.47 at the default 5 ms, 1.29-1.32 at
# 0.5 ms, 1.36 at 0.2 ms. Not re-measured since (deployments/worker_niceness.py).
GIL_SWITCH_INTERVAL_S = 0.0005


@serve.deployment(max_ongoing_requests=256,
                  ray_actor_options={"num_cpus": 1, "runtime_env": NORMAL_PRIORITY_RUNTIME_ENV})
class TargetModel:
    async def __init__(self, config: EngineConfig, front: FrontConfig, model_name: str, metrics_hub=None,
                       draft=None, engine_process: bool = True, constraint=None):
        # Async so that the metrics reporter starts on this replica's event loop.
        self.config = config
        self.model_name = model_name
        serve_path = None
        if config.speculative_method == "draft" and draft is not None:
            serve_path = DraftClient(draft, asyncio.get_running_loop())
        if engine_process:  # the engine process calls the draft channel itself
            self.engine = await asyncio.to_thread(EngineProcess, config, serve_path, front)
        else:
            # The engine thread shares the GIL with this replica's event loop, which pickles
            # and sends every chunk; at Python's default 5 ms switch interval it waits behind it.
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
            proposer = DirectDraftProposer(serve_path) if serve_path is not None else None
            self.engine = AsyncLLMEngine(config, proposer, front)
        self.indexes = GuidedIndexStore(constraint)  # compiled formats, from the ConstraintService
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.reporter = None
        if metrics_hub is not None:
            self.reporter = EngineMetricsReporter(metrics_hub, self.replica_id, model_name,
                                                  self.engine.stats)
            self.reporter.start()

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: dict
                       ) -> AsyncIterator[RequestOutput]:
        """`params`: SamplingParams fields, plus `output_format` (an `OutputFormat`) when the
        output must follow a format."""
        params = dict(params)
        output_format = params.pop("output_format", None)
        sampling = SamplingParams(**params)
        index = await self.indexes.index(output_format) if output_format is not None else None
        async for out in self.engine.generate(request_id, prompt_token_ids, sampling, output_format, index):
            yield out

    def check_health(self) -> None:
        """Serve replaces the replica when its engine process is gone."""
        if self.engine.error is not None:
            raise RuntimeError(self.engine.error)

    def stats(self) -> dict:
        """The engine's figures, plus how many format indexes this replica fetched from the
        ConstraintService and sent to its engine."""
        return {**dataclasses.asdict(self.engine.stats()), "replica_id": self.replica_id,
                "index_fetches": self.indexes.fetches, "formats_sent": self.engine.formats_sent}

    def record_autoscaling_stats(self) -> dict[str, float]:
        return target_autoscaling_stats(self.engine.stats())

    async def record_routing_stats(self) -> dict:
        """For the prefix-aware router (deployments/prefix_routing.py): what the KV pool holds
        and how loaded the engine is. Serve asks every `request_routing_stats_period_s`."""
        report = await self.engine.cache_report(MAX_REPORTED_BLOCKS)
        stats = self.engine.stats()
        return RoutingStats(report.block_size, pack_hashes(report.block_hashes), stats.num_requests_running,
                            num_requests_waiting=self.engine.num_waiting(),
                            num_requests_queued=stats.num_requests_waiting,  # as its last step left them
                            max_num_seqs=self.config.max_num_seqs, kv_cache_usage=stats.kv_cache_usage,
                            reported_at=time.time()).to_dict()

    def __del__(self):
        if getattr(self, "reporter", None) is not None:
            self.reporter.stop()
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown()
