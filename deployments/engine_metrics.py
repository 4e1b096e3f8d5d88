"""The target replicas' engine figures as Prometheus families, reported to the MetricsHub.

Engine figures (running, waiting, KV usage, prefix cache, preemptions) and the speculative-
decoding counters with vLLM's names (`spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos`), the steps by the k chosen for
them (`spec_decode_steps{k}`: adaptive speculation's choices), plus the acceptance rate and
mean accepted length as gauges for dashboards that do not do the division themselves.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from deployments.metrics import PREFIX, REPORT_INTERVAL_S, HubReporter, families_to_samples


def engine_families(stats, model_name: str, replica_id: str) -> list[Metric]:
    """An `EngineStats` as Prometheus families labelled with this replica."""
    labels = ["model_name", "replica"]
    values = [model_name, replica_id]

    def gauge(name, doc, value):
        g = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
        g.add_metric(values, float(value))
        return g

    def counter(name, doc, value):
        c = CounterMetricFamily(PREFIX + name, doc, labels=labels)
        c.add_metric(values, float(value))
        return c

    return [
        gauge("num_requests_running", "Number of requests in the model execution batches.",
              stats.num_requests_running),
        gauge("num_requests_waiting", "Number of requests waiting to be processed.",
              stats.num_requests_waiting),
        gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
              stats.kv_cache_usage),
        gauge("kv_cache_num_blocks", "Number of KV-cache blocks in the pool.",
              stats.num_blocks_total),
        counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                stats.prefix_cache_queries),
        counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                stats.prefix_cache_hits),
        counter("num_preemptions", "Cumulative number of preemptions from the engine.",
                stats.num_preemptions),
        counter("engine_prompt_tokens_computed",
                "Prompt tokens computed by the engine (prefix-cache hits excluded).",
                stats.prompt_tokens),
        counter("engine_steps", "Engine steps run.", stats.num_steps),
        *spec_families(stats.spec, labels, values),
    ]


def spec_families(spec, labels: list[str], values: list[str]) -> list[Metric]:
    def one(kind, name, doc, value):
        family = kind(PREFIX + name, doc, labels=labels)
        family.add_metric(values, float(value))
        return family

    per_position = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                       "Accepted draft tokens, by position in the draft.",
                                       labels=[*labels, "position"])
    for position, accepted in enumerate(spec.accepted_per_position):
        per_position.add_metric([*values, str(position)], float(accepted))
    steps_by_k = CounterMetricFamily(PREFIX + "spec_decode_steps", "Decoding steps, by the number of "
                                     "draft tokens per request they ran with (k; 0: no row drafted).",
                                     labels=[*labels, "k"])
    for k, steps in sorted(spec.steps_by_k.items()):
        steps_by_k.add_metric([*values, str(k)], float(steps))
    return [
        one(CounterMetricFamily, "spec_decode_num_drafts", "Number of spec decoding drafts.",
            spec.num_drafts),
        one(CounterMetricFamily, "spec_decode_num_draft_tokens", "Number of draft tokens.",
            spec.num_draft_tokens),
        one(CounterMetricFamily, "spec_decode_num_accepted_tokens", "Number of accepted tokens.",
            spec.num_accepted_tokens),
        per_position,
        steps_by_k,
        one(GaugeMetricFamily, "spec_decode_draft_acceptance_rate",
            "Accepted draft tokens / draft tokens, since start.", spec.acceptance_rate),
        one(GaugeMetricFamily, "spec_decode_mean_accepted_length",
            "Tokens emitted per speculative step (accepted drafts + 1), since start.",
            spec.mean_accepted_length),
        one(CounterMetricFamily, "spec_decode_proposals", "Draft proposals asked for (one per step "
            "with drafts, for the whole batch).", spec.num_proposals),
        one(CounterMetricFamily, "spec_decode_proposal_seconds", "Time the engine waited for draft "
            "proposals (served: the DraftModel round trip and the draft's forward).", spec.proposal_seconds),
        one(CounterMetricFamily, "spec_decode_drafts_sent_ahead", "Requests whose next step's drafts "
            "were asked for while a step ran.", spec.num_drafts_sent_ahead),
        one(CounterMetricFamily, "spec_decode_drafts_ahead_used", "Of those, the ones whose next step "
            "took them (every draft and the guessed token held): no wait for drafts.", spec.num_drafts_ahead_used),
        one(CounterMetricFamily, "spec_decode_drafts_looked_up", "Requests whose drafts of a step were "
            "found in their own tokens (prompt lookup), without asking the draft model.", spec.num_drafts_looked_up),
        one(CounterMetricFamily, "spec_decode_drafts_from_recent_outputs", "Requests whose n-gram drafts of a "
            "step were found in the outputs of other requests that finished lately.", spec.num_drafts_from_recent_outputs),
        one(CounterMetricFamily, "spec_decode_drafts_from_prediction", "Requests whose drafts of a step were "
            "taken from their predicted output (OpenAI's `prediction`).", spec.num_drafts_from_prediction),
        one(CounterMetricFamily, "spec_decode_num_proposer_failures",
            "Steps whose draft proposal failed (decoded without drafts).",
            spec.num_proposer_failures),
    ]


class EngineMetricsReporter(HubReporter):
    """Reports one target replica's engine figures to the hub about every second."""

    def __init__(self, hub_handle, replica_id: str, model_name: str, get_stats: Callable,
                 deployment: str = "TargetModel", interval_s: float = REPORT_INTERVAL_S):
        super().__init__(hub_handle, deployment, replica_id, interval_s)
        self.replica_id = replica_id
        self.model_name = model_name
        self.get_stats = get_stats

    def samples(self) -> list[dict]:
        return families_to_samples(engine_families(self.get_stats(), self.model_name, self.replica_id))
