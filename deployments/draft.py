"""DraftModel: the small model that proposes speculative tokens for a target replica's batch,
and `DraftClient`, the target-side proposer that calls it.

One call per target engine step carries every speculating sequence (its tokens, k, how to
sample); the answer is k tokens per sequence, with the draft distribution when the request
samples. The API is stateless, so any replica can answer; each replica keeps a prefix cache
of its own KV, so a sequence it saw last step recomputes only its new tokens.
"""

from __future__ import annotations

import asyncio
import time

from ray import serve

from app.config import EngineConfig
from app.engine.spec.draft_worker import DraftWorker
from app.engine.spec.proposal import DraftInput, Proposal
from deployments.worker_niceness import NORMAL_PRIORITY_RUNTIME_ENV


@serve.deployment(ray_actor_options={"num_cpus": 0.5, "runtime_env": NORMAL_PRIORITY_RUNTIME_ENV})
class DraftModel:
    def __init__(self, config: EngineConfig):
        self.worker = DraftWorker(config)
        self._lock = asyncio.Lock()  # one batch at a time through the model and its KV pool

    async def propose(self, inputs: list[DraftInput]) -> list[Proposal]:
        async with self._lock:
            return await asyncio.to_thread(self.worker.propose_batch, inputs)

    def stats(self) -> dict:
        bm = self.worker.block_manager
        return {"num_calls": self.worker.num_calls, "num_computed_tokens": self.worker.num_computed_tokens,
                "num_blocks_used": bm.num_used_blocks, "prefix_cache_hits": bm.prefix_cache_hits,
                "prefix_cache_queries": bm.prefix_cache_queries}


class DraftClient:
    """The engine's proposer, backed by the DraftModel deployment (called from the engine
    thread, so it may block). A failed or slow call raises (the engine counts it in
    `spec_decode_num_proposer_failures` and decodes that step without drafts), and further
    calls return no drafts for `retry_after_s`, so a lost draft replica costs one timeout, not
    one per step, while Serve replaces it.

    The call is made on the replica's event loop (`loop`), not from the engine thread: in Ray
    Serve's throughput mode a handle's router lives on that loop and refuses callers outside
    it, and a refused call here would silently mean no speculation at all."""

    def __init__(self, handle, loop: asyncio.AbstractEventLoop, timeout_s: float = 2.0,
                 retry_after_s: float = 2.0):
        self.handle = handle
        self.loop = loop
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._paused_until = 0.0

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        if time.monotonic() < self._paused_until:
            return [Proposal([]) for _ in inputs]
        call = asyncio.run_coroutine_threadsafe(self._propose(inputs), self.loop)
        try:
            return call.result(timeout=self.timeout_s)
        except Exception:
            call.cancel()
            self._paused_until = time.monotonic() + self.retry_after_s
            raise  # the engine's Speculator logs and counts it

    async def _propose(self, inputs: list[DraftInput]) -> list[Proposal]:
        return await self.handle.propose.remote(inputs)
