"""DraftModel: the small model that proposes speculative tokens for a target replica's batch,
and `DraftClient`, the target side's way to it through Serve.

One call per target engine step carries every speculating sequence (its tokens, k, how to
sample); the answer is k tokens per sequence, with the draft distribution when the request
samples. The API is stateless, so any replica can answer; each replica keeps a prefix cache
of its own KV, so a sequence it saw last step recomputes only its new tokens.

Engines call a replica directly on its draft channel (app/engine/spec/draft_channel.py), found
through Serve with `channel_address`; `propose` through Serve is the fallback. Serve does not
see the direct calls, so the replica counts every call itself (`ProposalLoad`) and reports it
for autoscaling (`deployments.autoscaling:draft_load_policy`).
"""

from __future__ import annotations

import asyncio
import threading
import time

import ray
from ray import serve

from app.config import EngineConfig
from app.engine.spec.draft_channel import DraftChannelAddress, DraftChannelServer
from app.engine.spec.draft_worker import DraftWorker
from app.engine.spec.proposal import DraftInput, Proposal
from deployments.autoscaling import ONGOING_PROPOSALS
from deployments.worker_niceness import NORMAL_PRIORITY_RUNTIME_ENV


class ProposalLoad:
    """The mean number of proposal calls in progress (waiting for the model or running) over
    each period between two reads: the figure Serve would count as ongoing requests."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ongoing = 0
        self._since = self._changed = time.monotonic()
        self._area = 0.0  # integral of the ongoing count over time, since `_since`

    def begin(self) -> None:
        self._step(+1)

    def end(self) -> None:
        self._step(-1)

    def read(self) -> float:
        with self._lock:
            now = self._advance()
            mean = self._area / (now - self._since) if now > self._since else float(self._ongoing)
            self._since, self._area = now, 0.0
            return mean

    def _step(self, delta: int) -> None:
        with self._lock:
            self._advance()
            self._ongoing += delta

    def _advance(self) -> float:
        now = time.monotonic()
        self._area += self._ongoing * (now - self._changed)
        self._changed = now
        return now


@serve.deployment(ray_actor_options={"num_cpus": 0.5, "runtime_env": NORMAL_PRIORITY_RUNTIME_ENV})
class DraftModel:
    def __init__(self, config: EngineConfig):
        self.worker = DraftWorker(config)
        self._lock = threading.Lock()  # one batch at a time through the model and its KV pool
        self.load = ProposalLoad()
        self.num_serve_calls = 0  # proposals through Serve: engines without a channel to this replica
        self.channel = DraftChannelServer(self._propose, ray.util.get_node_ip_address())

    async def propose(self, inputs: list[DraftInput]) -> list[Proposal]:
        self.num_serve_calls += 1
        return await asyncio.to_thread(self._propose, inputs)

    def channel_address(self) -> DraftChannelAddress:
        return self.channel.address

    def _propose(self, inputs: list[DraftInput]) -> list[Proposal]:
        self.load.begin()
        try:
            with self._lock:
                return self.worker.propose_batch(inputs)
        finally:
            self.load.end()

    def record_autoscaling_stats(self) -> dict[str, float]:
        return {ONGOING_PROPOSALS: self.load.read()}

    def stats(self) -> dict:
        bm = self.worker.block_manager
        return {"num_calls": self.worker.num_calls, "num_serve_calls": self.num_serve_calls,
                "num_computed_tokens": self.worker.num_computed_tokens,
                "num_blocks_used": bm.num_used_blocks, "prefix_cache_hits": bm.prefix_cache_hits,
                "prefix_cache_queries": bm.prefix_cache_queries}

    def __del__(self):
        if getattr(self, "channel", None) is not None:
            self.channel.close()


class DraftClient:
    """The DraftModel deployment through Serve, for the engine's `DirectDraftProposer`: proposals
    while no draft channel is up, and the search for one (called from the engine thread, or
    the engine process's reader thread, so it may block). A failed or slow call raises (the engine counts it in
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
        try:
            return self._call("propose", inputs)
        except Exception:
            self._paused_until = time.monotonic() + self.retry_after_s
            raise  # the engine's Speculator logs and counts it

    def find_draft_channel(self) -> DraftChannelAddress:
        return self._call("channel_address")

    def _call(self, method: str, *args):
        async def call():  # the handle's method is looked up on the loop too (Serve's router is bound to it)
            return await getattr(self.handle, method).remote(*args)

        future = asyncio.run_coroutine_threadsafe(call(), self.loop)
        try:
            return future.result(timeout=self.timeout_s)
        except Exception:
            future.cancel()
            raise
