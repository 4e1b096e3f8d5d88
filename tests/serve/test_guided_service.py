"""The ConstraintService in the real Serve app: bad formats get a 400 naming the problem, a
compile past the limit too (and the service keeps serving), repeated formats hit the cache
(metrics), and a target-side store fetches each index once. Nothing here needs the engine to
apply masks (tests/guided/test_served_guided.py does)."""

from __future__ import annotations

import asyncio
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from app.guided.vocabulary import load_guided_vocabulary
from tests.serve.conftest import start_serve_app, stop_serve_app

COMPILE_TIMEOUT_S = 0.5
SLOW_REGEX = "[ab]*a[ab]{14}"  # a 16k-state DFA: seconds to index over a 4k vocabulary
MESSAGES = [{"role": "user", "content": "Give me JSON."}]


@pytest.fixture(scope="module")
def serve_app(checkpoints):
    """The app with a short compile limit (Serve user_config), no draft model."""
    import deployments.builder as builder

    original = builder.ConstraintService
    builder.ConstraintService = original.options(
        user_config={"compile_timeout_s": COMPILE_TIMEOUT_S})
    try:
        app = start_serve_app("test_guided_service", {
            "model": str(checkpoints[0]), "device": "cpu", "num_kv_blocks": 128, "max_num_seqs": 8})
    finally:
        builder.ConstraintService = original
    try:
        yield app
    finally:
        stop_serve_app()


@pytest.fixture(scope="module")
def constraint(serve_app):
    from ray import serve

    return serve.get_deployment_handle("ConstraintService", serve_app.name)


def post(app, path: str, body: dict) -> requests.Response:
    return requests.post(f"{app.base_url}{path}", json=body, timeout=120)


def chat(app, **fields) -> requests.Response:
    return post(app, "/chat/completions", {"messages": MESSAGES, "max_tokens": 4, **fields})


def scrape(app) -> dict[str, float]:
    text = requests.get(app.url + "/metrics", timeout=30).text
    return {s.name + "".join(f"|{v}" for k, v in sorted(s.labels.items()) if k == "reason"): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("specserve:guided_")}


def metric_after(app, name: str, at_least: float) -> float:
    """The merged value of `name` once it reaches `at_least` (the service reports every ~1 s)."""
    value = 0.0
    for _ in range(60):
        value = scrape(app).get(name, 0.0)
        if value >= at_least:
            break
        time.sleep(0.5)
    return value


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize("fields,param,message", [
    ({"response_format": schema_format({"type": "foo"})}, "response_format", "invalid JSON schema"),
    ({"response_format": schema_format({"type": "object", "patternProperties": {"^a": {}}})},
     "response_format", "unsupported JSON schema keyword 'patternProperties'"),
    ({"response_format": schema_format({"properties": {"a": {"$ref": "#/$defs/none"}}})},
     "response_format", "reference"),
    ({"response_format": schema_format({"type": "string", "format": "duration"})}, "response_format",
     "duration"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"guided_regex": "[a-"}, "guided_regex", "invalid regex"),
    ({"guided_regex": "a(?=b)"}, "guided_regex", "lookaround"),
    ({"guided_choice": []}, "guided_choice", "choices"),
    ({"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs", "grammar"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "one output format"),
])
def test_bad_formats_get_400(serve_app, fields, param, message):
    r = chat(serve_app, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_compile_past_the_limit_is_400_and_the_service_keeps_serving(serve_app, constraint):
    r = chat(serve_app, guided_regex=SLOW_REGEX)
    assert r.status_code == 400, r.text
    assert "longer than" in r.json()["error"]["message"]
    again = chat(serve_app, guided_regex=SLOW_REGEX)  # remembered: refused without compiling
    assert again.status_code == 400 and "longer than" in again.json()["error"]["message"]
    spec = constraint.compile.remote({"type": "regex", "pattern": "[0-9]{3}"}).result()
    assert spec["regex"] == "[0-9]{3}"
    r = post(serve_app, "/completions", {"prompt": "still serving", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert metric_after(serve_app, "specserve:guided_compile_errors_total|timeout", 2) >= 2


def test_repeated_format_hits_the_cache(serve_app):
    fmt = {"guided_choice": ["cache me", "or not"]}
    before = scrape(serve_app)
    hits = before.get("specserve:guided_compile_cache_hits_total", 0.0)
    misses = before.get("specserve:guided_compile_cache_misses_total", 0.0)
    compiles = before.get("specserve:guided_compile_seconds_count", 0.0)
    for _ in range(3):
        assert chat(serve_app, **fmt).status_code != 400  # the format itself is accepted
    # Compiles: one miss, then two hits; the target replica then fetches the index once (a hit
    # too) and serves the later requests from its own store.
    assert metric_after(serve_app, "specserve:guided_compile_cache_hits_total", hits + 3) == hits + 3
    after = scrape(serve_app)
    assert after["specserve:guided_compile_cache_misses_total"] == misses + 1
    assert after["specserve:guided_compile_seconds_count"] == compiles + 1


def test_spec_and_target_side_store(serve_app, constraint):
    from deployments.guided_client import GuidedIndexStore

    fmt = {**schema_format({"type": "object", "properties": {"ok": {"type": "boolean"}},
                            "required": ["ok"]}), "whitespace_pattern": ""}
    spec = constraint.compile.remote(fmt).result()
    vocab = load_guided_vocabulary(serve_app.checkpoint)
    assert set(spec) == {"vocab_hash", "regex", "key"} and spec["vocab_hash"] == vocab.vocab_hash
    assert constraint.compile.remote(fmt).result() == spec  # same format, same spec

    async def resolve_twice():
        store = GuidedIndexStore(str(serve_app.checkpoint), constraint)
        first, second = await asyncio.gather(store.resolve(spec), store.resolve(spec))
        third = await store.resolve(spec)
        with pytest.raises(ValueError, match="another vocabulary"):
            await store.resolve({**spec, "vocab_hash": "0" * 64})
        return store, first, second, third

    store, first, second, third = asyncio.run(resolve_twice())
    assert first is second is third and store.fetches == 1
    dec = first.decoder(logits_width=4096)
    forced = dec.forced_token_ids(store.tokenizer)  # compact JSON: '{"ok":' is forced
    assert forced and dec.accept_prefix(forced) == len(forced)
    assert b'{"ok":'.startswith(b"".join(vocab.token_bytes[t] for t in forced))
