"""Prometheus metrics for every stage, served by the ingress at `GET /metrics`.

Every stage keeps its own figures and reports them, as plain data, to one `MetricsHub`
replica; an ingress replica answering `GET /metrics` pushes its own figures there and renders
the hub's merged view, so one scrape of the app's port sees every ingress replica and the KV
usage of every target replica.

    Ingress replica ──report──▶ MetricsHub ◀──report (every ~1 s)── TargetModel replica
          └── GET /metrics ──render──┘

Metric names are vLLM's with the `specserve:` prefix. Request-level figures (TTFT, ITL,
TPOT, e2e, tokens, finished requests) come from the ingress, which sees every token leave;
engine figures (running, waiting, KV usage, prefix cache, preemptions) from each target
replica. Every series carries `model_name` and `replica` (the reporting replica), so two
replicas never collide; sum over `replica` for the deployment-wide figure.

Not measured: `request_queue_time_seconds` (the engine does not timestamp when a request is
first scheduled; TTFT includes the queueing).

A report is a list of families, each `{"name", "type", "help", "samples": [[sample_name,
labels, value], ...]}` (see `families_to_samples`): plain data, cheap to send over Ray.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from ray import serve

logger = logging.getLogger(__name__)

PREFIX = "specserve:"
STALE_AFTER_S = 30.0
REPORT_INTERVAL_S = 1.0
FINISHED_REASONS = ("stop", "length", "abort")

# Bucket edges after vLLM's, with finer low ends for small models on a CPU.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
               20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                 100000, 200000)


# -- plain-data form of metric families -------------------------------------------------------
def families_to_samples(families: Iterable[Metric]) -> list[dict]:
    """prometheus_client families → plain data (`_created` samples dropped)."""
    out = []
    for fam in families:
        samples = [[s.name, dict(s.labels), float(s.value)] for s in fam.samples
                   if not s.name.endswith("_created")]
        out.append({"name": fam.name, "type": fam.type, "help": fam.documentation,
                    "samples": samples})
    return out


def _source_key(source: dict[str, str]) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in source.items()))


def merge_families(reports: Iterable[list[dict]]) -> list[Metric]:
    """Merge families of the same name from many sources into one family each.

    Samples with the same name and labels (which distinct replicas never produce) are summed
    so the exposition never holds a duplicate series; a family reported under a different
    type by another source is skipped with a warning rather than breaking the whole scrape.
    """
    merged: dict[str, Metric] = {}
    index: dict[str, dict[tuple, int]] = {}
    for families in reports:
        for fam in families:
            name, typ = fam["name"], fam["type"]
            metric = merged.get(name)
            if metric is None:
                metric = merged[name] = Metric(name, fam.get("help", ""), typ)
                index[name] = {}
            elif metric.type != typ:
                logger.warning("metric %s reported as %s and as %s; dropping the latter",
                               name, metric.type, typ)
                continue
            for sample_name, labels, value in fam["samples"]:
                key = (sample_name, tuple(sorted(labels.items())))
                at = index[name].get(key)
                if at is None:
                    index[name][key] = len(metric.samples)
                    metric.add_sample(sample_name, labels, value)
                else:
                    old = metric.samples[at]
                    metric.samples[at] = old._replace(value=old.value + value)
    return [merged[name] for name in sorted(merged)]


class _StaticCollector:
    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self):
        return iter(self._families)


def render_families(families: list[Metric]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StaticCollector(families))
    return generate_latest(registry).decode()


async def _call(target: Any, method: str, *args):
    """Call `method` on a Serve deployment handle or, in tests, on a plain object."""
    fn = getattr(target, method)
    remote = getattr(fn, "remote", None)
    result = remote(*args) if remote is not None else fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _replica_id() -> str:
    """This Serve replica's id, or a random one outside Serve."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not inside a replica (tests, scripts)
        return uuid.uuid4().hex[:8]


# -- the hub ----------------------------------------------------------------------------------
@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class MetricsHub:
    """Latest report of every live source; renders them merged as one exposition."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S):
        self.stale_after_s = stale_after_s
        self._reports: dict[tuple, tuple[float, dict[str, str], list[dict]]] = {}

    async def report(self, source: dict[str, str], samples: list) -> None:
        self._reports[_source_key(source)] = (time.monotonic(), dict(source), list(samples))

    async def remove(self, source: dict[str, str]) -> None:
        """A source that stops (a replica shutting down) leaves at once, not after the timeout."""
        self._reports.pop(_source_key(source), None)

    def _live(self) -> list[tuple[dict[str, str], list[dict]]]:
        cutoff = time.monotonic() - self.stale_after_s
        for key in [k for k, (t, _, _) in self._reports.items() if t < cutoff]:
            del self._reports[key]
        return [(src, fams) for _, src, fams in self._reports.values()]

    async def render(self) -> str:
        live = self._live()
        replicas: dict[str, int] = {}
        for src, _ in live:
            deployment = src.get("deployment", "unknown")
            replicas[deployment] = replicas.get(deployment, 0) + 1
        count = GaugeMetricFamily(PREFIX + "num_replicas",
                                  "Replicas of each deployment reporting metrics",
                                  labels=["deployment"])
        for deployment in sorted(replicas):
            count.add_metric([deployment], replicas[deployment])
        reports = [fams for _, fams in live] + [families_to_samples([count])]
        return render_families(merge_families(reports))


# -- the ingress's request metrics ------------------------------------------------------------
class HubReporter:
    """One replica's figures, reported to the MetricsHub every `interval_s` in the background
    (subclasses say what: `samples()`); a failed report (the hub restarting) is logged and
    never takes the replica down. Without a hub (plain use, tests) it does nothing."""

    def __init__(self, hub_handle, deployment: str, replica: str, interval_s: float):
        self.hub = hub_handle
        self.interval_s = interval_s
        self.source = {"deployment": deployment, "replica": replica}
        self._task: asyncio.Task | None = None

    def samples(self) -> list[dict]:
        raise NotImplementedError

    async def report(self) -> None:
        if self.hub is not None:
            await _call(self.hub, "report", self.source, self.samples())

    def start(self) -> None:
        if self.hub is None or (self._task is not None and not self._task.done()):
            return
        try:
            self._task = asyncio.get_running_loop().create_task(self._report_forever())
        except RuntimeError:  # no running loop (plain synchronous use)
            pass

    async def _report_forever(self) -> None:
        while True:
            try:
                await self.report()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.debug("%s metrics report failed", self.source["deployment"], exc_info=True)
            await asyncio.sleep(self.interval_s)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.hub is not None:
            _fire_and_forget(self.hub, "remove", self.source)


class IngressMetrics(HubReporter):
    """Per-request latency and token metrics of one ingress replica. Reporting starts with the
    first request, so a scrape served by another ingress replica sees this one."""

    def __init__(self, hub_handle, model_name: str, deployment: str = "Ingress",
                 report_interval_s: float = REPORT_INTERVAL_S):
        self.replica = _replica_id()
        super().__init__(hub_handle, deployment, self.replica, report_interval_s)
        self.model_name = model_name
        self.registry = r = CollectorRegistry(auto_describe=False)
        labels = ["model_name", "replica"]

        def hist(name, doc, buckets):
            return Histogram(PREFIX + name, doc, labels, registry=r, buckets=buckets).labels(
                model_name, self.replica)

        def counter(name, doc):
            return Counter(PREFIX + name, doc, labels, registry=r).labels(model_name, self.replica)

        self.ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds",
                        "Histogram of the time between successive chunks of output tokens in seconds.",
                        ITL_BUCKETS)
        self.tpot = hist("request_time_per_output_token_seconds",
                         "Histogram of (e2e latency - TTFT) / (output tokens - 1) per request in seconds.",
                         ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds",
                        "Histogram of end to end request latency in seconds.", E2E_BUCKETS)
        self.prompt_len = hist("request_prompt_tokens", "Number of prompt tokens per request.",
                               TOKEN_BUCKETS)
        self.generation_len = hist("request_generation_tokens",
                                   "Number of generated tokens per request.", TOKEN_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "Number of prompt tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        success = Counter(PREFIX + "request_success", "Count of finished requests by finish reason.",
                          labels + ["finished_reason"], registry=r)
        self.success = {reason: success.labels(model_name, self.replica, reason)
                        for reason in FINISHED_REASONS}
        self._success_family = success

    def start_request(self, num_prompt_tokens: int) -> "RequestTimer":
        self.start()
        return RequestTimer(self, num_prompt_tokens)

    def finished(self, reason: str | None):
        reason = reason or "abort"
        if reason not in self.success:
            self.success[reason] = self._success_family.labels(self.model_name, self.replica, reason)
        return self.success[reason]

    def samples(self) -> list[dict]:
        return families_to_samples(self.registry.collect())

    def render_local(self) -> str:
        return render_families(merge_families([self.samples()]))

    async def render(self) -> str:
        """This replica's figures and the hub's, as one exposition (its own only if the hub is away)."""
        if self.hub is None:
            return self.render_local()
        try:
            await self.report()
            return await _call(self.hub, "render")
        except Exception:
            logger.warning("metrics hub unreachable; rendering this ingress replica only", exc_info=True)
            return self.render_local()


class RequestTimer:
    """Times one request from arrival at the ingress to its last token."""

    def __init__(self, metrics: IngressMetrics, num_prompt_tokens: int,
                 clock: Callable[[], float] = time.perf_counter):
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.clock = clock
        self.start = clock()
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.num_generation_tokens = 0
        self.finished = False

    def on_tokens(self, num_new_tokens: int) -> None:
        if self.finished or num_new_tokens <= 0:
            return
        now = self.clock()
        m = self.metrics
        if self.first_token_time is None:
            self.first_token_time = now
            m.ttft.observe(now - self.start)
        else:
            m.itl.observe(now - self.last_token_time)
        self.last_token_time = now
        self.num_generation_tokens += num_new_tokens
        m.generation_tokens.inc(num_new_tokens)

    def on_finish(self, finish_reason: str | None, num_prompt_tokens: int,
                  num_generation_tokens: int) -> None:
        if self.finished:
            return
        self.finished = True
        now = self.clock()
        m = self.metrics
        if num_generation_tokens > self.num_generation_tokens:  # tokens never passed to on_tokens
            m.generation_tokens.inc(num_generation_tokens - self.num_generation_tokens)
        m.prompt_tokens.inc(num_prompt_tokens)
        m.prompt_len.observe(num_prompt_tokens)
        m.generation_len.observe(num_generation_tokens)
        m.e2e.observe(now - self.start)
        if self.first_token_time is not None and num_generation_tokens > 1:
            m.tpot.observe((now - self.first_token_time) / (num_generation_tokens - 1))
        m.finished(finish_reason).inc()


def _fire_and_forget(target: Any, method: str, *args) -> None:
    """Best effort, from synchronous code (a replica's shutdown)."""
    try:
        fn = getattr(target, method)
        remote = getattr(fn, "remote", None)
        if remote is not None:
            remote(*args)
        else:
            result = fn(*args)
            if inspect.iscoroutine(result):
                try:
                    asyncio.get_running_loop().create_task(result)
                except RuntimeError:
                    result.close()
    except Exception:
        logger.debug("metrics %s failed", method, exc_info=True)
