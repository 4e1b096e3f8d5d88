"""Speculative decoding end to end through the Serve app: the DraftModel deployment proposes,
over its draft channel, and target replicas verify; greedy text equals the engine without
speculation, the spec metrics move, a request can opt out, and a killed draft replica only
pauses speculation."""

from __future__ import annotations

import time

import openai
import pytest
import ray
import requests
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from tests.serve.test_openai_api import engine_text

pytestmark = pytest.mark.slow

# k by the schedule alone: these tests need drafts in the steps they watch, whatever adaptive
# speculation would decide on this machine (tests/spec/test_adaptive_speculation.py tests that).
# No lookup in recent outputs: these tests send prompts again and watch the draft model's calls,
# which a repeated prompt's earlier answer would stand in for (tests/spec/test_recent_outputs.py).
SERVE_APP_ARGS = {"speculative_method": "draft", "num_speculative_tokens": 4,
                  "speculation_schedule": "1:4,32:0", "adaptive_speculation": False,
                  "lookup_recent_output_tokens": 0}
PROMPTS = ["def add(a, b):", "import os\nimport sys\n", "class Point:\n    def __init__(self"]


@pytest.fixture(scope="module")
def plain_engine(serve_app):
    from app.config import EngineConfig
    from app.engine.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(serve_app.checkpoint), num_kv_blocks=256))


def spec_counters(serve_app) -> dict[str, float]:
    text = requests.get(serve_app.url + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("specserve:spec_decode") and "position" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_greedy_text_equals_plain_decoding_and_spec_metrics_move(serve_app, client, plain_engine, tokenizer):
    for prompt in PROMPTS:
        expected, _ = engine_text(plain_engine, tokenizer, tokenizer.encode(prompt), 40)
        got = client.completions.create(model=serve_app.model, prompt=prompt, max_tokens=40, temperature=0)
        assert got.choices[0].text == expected
    draft_stats = serve.get_deployment_handle("DraftModel", serve_app.name).stats.remote().result()
    assert draft_stats["num_calls"] > 0 and draft_stats["num_blocks_used"] == 0
    assert draft_stats["num_serve_calls"] == 0  # every proposal over the draft channel
    spec = serve_app.target_handle().stats.remote().result()["spec"]
    assert spec["num_drafts_sent_ahead"] > spec["num_drafts_ahead_used"] > 0  # some held, some did not
    deadline = time.monotonic() + 10  # engine figures reach the hub about every second
    while (counters := spec_counters(serve_app)).get("specserve:spec_decode_num_accepted_tokens_total", 0) == 0:
        assert time.monotonic() < deadline, counters
        time.sleep(0.5)
    assert counters["specserve:spec_decode_num_draft_tokens_total"] >= counters[
        "specserve:spec_decode_num_accepted_tokens_total"] > 0
    assert 0 < counters["specserve:spec_decode_draft_acceptance_rate"] <= 1


def test_streamed_sampled_request_and_opt_out(serve_app, client):
    before = serve_app.target_handle().stats.remote().result()["spec"]["num_drafts"]
    got = client.completions.create(model=serve_app.model, prompt=PROMPTS[0], max_tokens=30,
                                    temperature=0, extra_body={"speculative_decoding": False})
    assert got.usage.completion_tokens > 0
    assert serve_app.target_handle().stats.remote().result()["spec"]["num_drafts"] == before
    stream = client.completions.create(model=serve_app.model, prompt=PROMPTS[1], max_tokens=30,
                                       temperature=0.8, seed=3, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = [c for c in stream]
    assert sum(len(c.choices[0].text) for c in chunks if c.choices) > 0
    assert serve_app.target_handle().stats.remote().result()["spec"]["num_drafts"] > before


def test_a_predicted_chat_answer_is_drafted_from_its_prediction(serve_app, client):
    """OpenAI's `prediction`: the greedy answer is the same with it, whole or streamed; a right one
    gives drafts the model keeps, counted in the metrics, and the usage counts all of it accepted; a
    wrong one, rejected; a malformed one is a 400."""
    ask = dict(model=serve_app.model, messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=40,
               temperature=0)
    plain = client.chat.completions.create(**ask)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens_details is None  # no prediction, no reasoning parser
    before = serve_app.target_handle().stats.remote().result()["spec"]["num_drafts_from_prediction"]
    predicted = client.chat.completions.create(**ask, prediction={"type": "content", "content": text})
    assert predicted.choices[0].message.content == text
    details = predicted.usage.completion_tokens_details  # OpenAI's: the prediction's tokens the output holds, the rest
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens == 0
    wrong = client.chat.completions.create(**ask, prediction={"type": "content", "content": "Zebras; " * 6})
    assert wrong.choices[0].message.content == text
    assert wrong.usage.completion_tokens_details.rejected_prediction_tokens >= 6
    assert serve_app.target_handle().stats.remote().result()["spec"]["num_drafts_from_prediction"] > before
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True},
                                                 prediction={"type": "content", "content": [
                                                     {"type": "text", "text": text}]}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0
    with pytest.raises(openai.BadRequestError, match="prediction"):
        client.chat.completions.create(**ask, prediction={"type": "file", "content": text})


def test_killed_draft_replica_only_pauses_speculation(serve_app, client, plain_engine, tokenizer):
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                if "DraftModel" in a["name"] and "SERVE_REPLICA" in a["name"]]
    assert replicas, ray.util.list_named_actors(all_namespaces=True)
    ray.kill(ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True)
    expected, _ = engine_text(plain_engine, tokenizer, tokenizer.encode(PROMPTS[2]), 40)
    failures = serve_app.target_handle().stats.remote().result()["spec"]["num_proposer_failures"]
    for _ in range(3):  # served (without drafts) while Serve replaces the replica
        got = client.completions.create(model=serve_app.model, prompt=PROMPTS[2], max_tokens=40, temperature=0)
        assert got.choices[0].text == expected
    assert serve_app.target_handle().stats.remote().result()["spec"]["num_proposer_failures"] > failures
    deadline = time.monotonic() + 60  # and speculation comes back with the new replica
    before = serve_app.target_handle().stats.remote().result()["spec"]["num_drafts"]
    while serve_app.target_handle().stats.remote().result()["spec"]["num_drafts"] == before:
        assert time.monotonic() < deadline, "speculation did not resume after the draft replica came back"
        client.completions.create(model=serve_app.model, prompt=PROMPTS[0], max_tokens=20, temperature=0)
        time.sleep(1)
