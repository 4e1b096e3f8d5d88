"""The ConstraintService's figures, reported to the MetricsHub like every other stage.

- `specserve:guided_compile_seconds` (histogram): time to build an index, per compile that ran;
- `specserve:guided_compile_cache_hits_total` / `..._misses_total`: format lookups that found a
  compiled index / had to compile (or wait for a compile already running);
- `specserve:guided_compile_errors_total{reason}`: formats refused (`invalid`, `timeout`, `busy`)
  when their index was built; a format that cannot become a regex (bad schema or pattern) is
  refused by the ingress and never gets here;
- `specserve:guided_compiled_indexes`: indexes held in the cache.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from app.guided.compiler import IndexCache
from deployments.metrics import PREFIX, REPORT_INTERVAL_S, HubReporter, _replica_id, families_to_samples

COMPILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   20.0, 40.0, 80.0)
ERROR_REASONS = ("invalid", "timeout", "busy")


class ConstraintMetrics(HubReporter):
    def __init__(self, hub_handle, model_name: str, cache: IndexCache,
                 deployment: str = "ConstraintService", interval_s: float = REPORT_INTERVAL_S):
        self.replica = _replica_id()
        super().__init__(hub_handle, deployment, self.replica, interval_s)
        self.model_name, self.cache = model_name, cache
        self.registry = r = CollectorRegistry(auto_describe=False)
        labels = ["model_name", "replica"]
        self.compile_seconds = Histogram(PREFIX + "guided_compile_seconds",
                                         "Histogram of time to compile an output format in seconds.",
                                         labels, registry=r, buckets=COMPILE_BUCKETS
                                         ).labels(model_name, self.replica)
        errors = Counter(PREFIX + "guided_compile_errors", "Output formats refused, by reason.",
                         labels + ["reason"], registry=r)
        self.errors = {reason: errors.labels(model_name, self.replica, reason)
                       for reason in ERROR_REASONS}

    def samples(self) -> list[dict]:
        for seconds in self.cache.take_compile_seconds():
            self.compile_seconds.observe(seconds)
        values = [self.model_name, self.replica]
        hits = CounterMetricFamily(PREFIX + "guided_compile_cache_hits",
                                   "Output format lookups answered from the compiled-index cache.",
                                   labels=["model_name", "replica"])
        hits.add_metric(values, self.cache.hits)
        misses = CounterMetricFamily(PREFIX + "guided_compile_cache_misses",
                                     "Output format lookups that had to compile.",
                                     labels=["model_name", "replica"])
        misses.add_metric(values, self.cache.misses)
        held = GaugeMetricFamily(PREFIX + "guided_compiled_indexes",
                                 "Compiled indexes held in the cache.", labels=["model_name", "replica"])
        held.add_metric(values, len(self.cache))
        return families_to_samples(list(self.registry.collect()) + [hits, misses, held])
