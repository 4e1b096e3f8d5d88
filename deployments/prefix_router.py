"""`PrefixAwareRouter`: Ray Serve's request router for TargetModel, sending each request to the
replica whose KV cache holds the longest prefix of its prompt (the rule and the replicas'
reports: deployments/prefix_routing.py).

Serve runs one router per handle, in the process that holds the handle (the Ingress
replicas); `build_app` names it in TargetModel's `request_router_config` when
`request_router: prefix_aware` (the default). Calls other than `generate` (stats, health)
carry no prompt and go to the least loaded replica.

What it decides is counted in this process (`ROUTING_FIGURES`), and the ingress reports the
counts with its own metrics (deployments/metrics.py), so one scrape shows them:
`specserve:router_requests_total{reason}`, `specserve:router_prompt_tokens_total`,
`specserve:router_matched_tokens_total`, `specserve:router_replica_cached_blocks{target}` (the
blocks each live replica last reported) and `specserve:router_replica_load{target}` (the requests
the router counts each live replica to hold, as it ranks them: deployments/prefix_routing.py,
`ReplicaView.load`); a replica that is gone has no series.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections import Counter, OrderedDict
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from app.engine.block_manager import block_hashes, root_hash
from deployments.metrics import PREFIX
from deployments.prefix_routing import (DEFAULT_MAX_LOAD_IMBALANCE, NEW_BLOCKS_WINDOW_S, ReplicaView, RoutingStats,
                                        rank_replicas)

logger = logging.getLogger("ray.serve")
MAX_REMEMBERED_REQUESTS = 10_000


class RoutingFigures:
    """What the routers of this process decided, for the ingress's metrics."""

    def __init__(self):
        self.requests: Counter[str] = Counter()  # by reason
        self.prompt_tokens = 0  # in full blocks, of routed prompts
        self.matched_tokens = 0  # of those, held by the chosen replica (as the router saw it)
        self.cached_blocks: dict[str, int] = {}  # live replica -> blocks in its last report
        self.loads: dict[str, int] = {}  # live replica -> requests it holds, as the router counts them

    def show(self, view: ReplicaView) -> None:
        """A replica's figures as its view now has them."""
        self.loads[view.replica_id] = view.load
        if view.stats is not None:
            self.cached_blocks[view.replica_id] = len(view.cached)

    def forget(self, replica_id: str) -> None:
        self.cached_blocks.pop(replica_id, None)
        self.loads.pop(replica_id, None)

    def record(self, reason: str, num_full_block_tokens: int, num_matched_tokens: int) -> None:
        self.requests[reason] += 1
        self.prompt_tokens += num_full_block_tokens
        self.matched_tokens += num_matched_tokens


ROUTING_FIGURES = RoutingFigures()


class RoutingCollector:
    """`ROUTING_FIGURES` as Prometheus families, for the ingress's registry."""

    def __init__(self, model_name: str, replica: str, figures: RoutingFigures = ROUTING_FIGURES):
        self.labels, self.values = ["model_name", "replica"], [model_name, replica]
        self.figures = figures

    def collect(self):
        f = self.figures
        requests = CounterMetricFamily(PREFIX + "router_requests", "Requests routed to a target replica, "
                                       "by why that one: prefix, load, no_prefix.", labels=self.labels + ["reason"])
        for reason in ("prefix", "load", "no_prefix"):
            requests.add_metric(self.values + [reason], f.requests[reason])
        prompt = CounterMetricFamily(PREFIX + "router_prompt_tokens",
                                     "Prompt tokens in full KV blocks, of routed requests.", labels=self.labels)
        prompt.add_metric(self.values, f.prompt_tokens)
        matched = CounterMetricFamily(PREFIX + "router_matched_tokens", "Of those, tokens the chosen replica "
                                      "held (its last report, or sent to it since).", labels=self.labels)
        matched.add_metric(self.values, f.matched_tokens)
        cached = GaugeMetricFamily(PREFIX + "router_replica_cached_blocks", "KV blocks each live target "
                                   "replica last reported cached.", labels=self.labels + ["target"])
        for target, blocks in sorted(f.cached_blocks.items()):
            cached.add_metric(self.values + [target], blocks)
        load = GaugeMetricFamily(PREFIX + "router_replica_load", "Requests each live target replica holds as "
                                 "this router counts them: its last report's, less those ended since, plus those "
                                 "sent to it since.", labels=self.labels + ["target"])
        for target, requests_held in sorted(f.loads.items()):
            load.add_metric(self.values + [target], requests_held)
        return [requests, prompt, matched, cached, load]


def prompt_of(request: PendingRequest | None) -> list[int] | None:
    """The prompt token ids of a `TargetModel.generate(request_id, prompt_token_ids, params)` call."""
    if request is None or request.metadata.call_method != "generate":
        return None
    if "prompt_token_ids" in request.kwargs:
        return request.kwargs["prompt_token_ids"]
    return request.args[1] if len(request.args) > 1 else None


def cache_salt_of(request: PendingRequest | None) -> str | None:
    """The `cache_salt` in a `generate` call's params (its blocks hash from a salted root)."""
    params = None
    if request is not None:
        params = request.kwargs.get("params", request.args[2] if len(request.args) > 2 else None)
    return params.get("cache_salt") if isinstance(params, dict) else None


class PrefixAwareRouter(FIFOMixin, RequestRouter):
    """A replica chosen for a request goes to that request (matched by Serve's internal request
    id); what no pending request matches goes to the oldest one (FIFOMixin). The fallback is
    needed: the n choices of one completion are n handle calls sharing one internal id, and
    Serve indexes only the first, so without it the others would wait forever.

    `request_router_kwargs`: `block_size` (the engines'), `max_load_imbalance` (requests a
    cache-holding replica may carry above the least loaded one before the latter wins) and
    `remember_sent_s` (how long the prefixes sent to a replica count as held, until its report
    shows them: a little over the report period)."""

    def initialize_state(self, block_size: int = 16, max_load_imbalance: int = DEFAULT_MAX_LOAD_IMBALANCE,
                         remember_sent_s: float = 2.0, **_: Any) -> None:
        self.block_size = block_size
        self.max_load_imbalance = max_load_imbalance
        self.remember_sent_s = remember_sent_s
        self.views: dict[ReplicaID, ReplicaView] = {}
        self._chosen: OrderedDict[str, None] = OrderedDict()  # requests routed lately, to tell retries
        # Serve unpickles this class by value, with copies of this module's globals: the
        # figures the ingress reports are the imported module's.
        self.figures = importlib.import_module(__name__).ROUTING_FIGURES

    def _view(self, replica: RunningReplica) -> ReplicaView:
        view = self.views.get(replica.replica_id)
        if view is None:
            view = self.views[replica.replica_id] = ReplicaView(replica.replica_id.unique_id)
            self.figures.show(view)
        stats = RoutingStats.from_dict(replica.routing_stats or {})
        if stats is not None and view.take_report(stats):
            self.figures.show(view)
        return view

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        prompt = prompt_of(pending_request)
        hashes = self._hashes(prompt, cache_salt_of(pending_request))
        views = [self._view(r) for r in candidate_replicas]
        replica_of = {id(v): r for v, r in zip(views, candidate_replicas)}
        now = time.time()
        for view in views:
            view.forget_sends_before(now - NEW_BLOCKS_WINDOW_S)
        decision = rank_replicas(hashes, views, self.max_load_imbalance)
        if prompt is not None:
            self.figures.record(decision.reason, len(hashes) * self.block_size,
                                decision.matched_blocks * self.block_size)
        # Counted as sent to the first choice: Serve tells a router where a request went only
        # under strict max_ongoing_requests (`on_request_routed`), and the first choice takes it
        # unless its replica is at max_ongoing_requests, far above what an engine batches; the
        # next report of that replica corrects any miscount.
        ranks = [[replica_of[id(v)]] for v in decision.ranked]
        if pending_request is None:
            return ranks
        request_id = pending_request.metadata.internal_request_id
        retry = request_id in self._chosen
        if retry:  # counted at its earlier choice
            for view in self.views.values():
                view.record_withdrawn(request_id)
        chosen = decision.ranked[0]
        chosen.record_sent(request_id, hashes, now, self.remember_sent_s)
        for view in self.views.values() if retry else [chosen]:
            self.figures.show(view)
        self._chosen[request_id] = None
        while len(self._chosen) > MAX_REMEMBERED_REQUESTS:
            self._chosen.popitem(last=False)
        # The first try offers the choice alone: Serve would move on to the next rank when a
        # queue-length probe is slow (a busy replica on a busy host), not only when it is full.
        return ranks if retry else ranks[:1]

    def _get_pending_request_matching_metadata(self, request_metadata=None) -> PendingRequest | None:
        """FIFOMixin's hook: the request this choice was made for, if it still waits."""
        return self._get_pending_request_matching_internal_request_id(request_metadata)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        view = self.views.get(replica_id)
        if view is not None:
            view.record_ended(internal_request_id)
            self.figures.show(view)

    def _hashes(self, prompt: list[int] | None, cache_salt: str | None) -> list[int]:
        return block_hashes(prompt, self.block_size, root_hash(cache_salt)) if prompt else []

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve calls this with every change to the replicas, their reports included."""
        super().update_replicas(replicas)
        self._forget_gone_replicas()
        for replica in replicas:
            self._view(replica)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget_gone_replicas()

    def _forget_gone_replicas(self) -> None:
        live = set(self._replicas)
        for replica_id in [r for r in self.views if r not in live]:
            view = self.views.pop(replica_id)
            self.figures.forget(view.replica_id)
            logger.info("prefix router: forgot replica %s", view.replica_id)
