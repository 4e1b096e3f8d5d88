"""Output formats in the real Serve app: bad formats get a 400 naming the problem, a compile
past the limit too (and the service keeps serving), a repeated format is compiled once
(metrics), a target-side store fetches each index once, and one `response_format` followed
from the HTTP request to the engine's mask is compiled once and crosses to the engine process
once. tests/guided/test_served_guided.py checks the masked output at length."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from app.guided.compiler import regex_for_format
from app.guided.guide import CompiledFormat
from app.guided.output_format import OutputFormat
from app.guided.vocabulary import load_guided_vocabulary
from tests.serve.conftest import start_serve_app, stop_serve_app

COMPILE_TIMEOUT_S = 0.5
SLOW_REGEX = "[ab]*a[ab]{14}"  # a 16k-state DFA: seconds to index over a 4k vocabulary
MESSAGES = [{"role": "user", "content": "Give me JSON."}]


@pytest.fixture(scope="module")
def serve_app(checkpoints):
    """The app with a short compile limit (an app argument), no draft model."""
    app = start_serve_app("test_guided_service", {
        "model": str(checkpoints[0]), "device": "cpu", "num_kv_blocks": 128, "max_num_seqs": 8,
        "guided_compile_timeout_s": COMPILE_TIMEOUT_S})
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


def settled_scrape(app, quiet_s: float = 2.5) -> dict[str, float]:
    """A scrape the stages' reports have caught up with (the same across `quiet_s`, two report
    periods), so that an earlier test's lookups are not counted as the next test's."""
    last = scrape(app)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = scrape(app)
        if now == last:
            return now
        last = now
    raise AssertionError("the guided-decoding figures did not settle within 60 s")


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
    ({"structured_outputs": {"grammar": 'root ::= "a" root | "b"'}}, "structured_outputs", "refers to itself"),
    ({"guided_grammar": 'root ::= value'}, "guided_grammar", "rule 'value' is used but not defined"),
    ({"guided_grammar": "%declare X\nstart: X"}, "guided_grammar", "%declare is not supported"),
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
    index = constraint.index.remote(OutputFormat("[0-9]{3}")).result()
    assert index.get_allowed_tokens(index.get_initial_state())
    r = post(serve_app, "/completions", {"prompt": "still serving", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert metric_after(serve_app, "specserve:guided_compile_errors_total|timeout", 2) >= 2


def test_repeated_format_hits_the_cache(serve_app):
    fmt = {"guided_choice": ["cache me", "or not"]}
    before = settled_scrape(serve_app)
    hits = before.get("specserve:guided_compile_cache_hits_total", 0.0)
    misses = before.get("specserve:guided_compile_cache_misses_total", 0.0)
    compiles = before.get("specserve:guided_compile_seconds_count", 0.0)
    for _ in range(3):
        assert chat(serve_app, **fmt).status_code != 400  # the format itself is accepted
    # Only the target replica asks the service, once: one miss, one compile; it serves the
    # later requests from its own store, so the service sees no more lookups (no hits).
    assert metric_after(serve_app, "specserve:guided_compile_cache_misses_total", misses + 1) >= misses + 1
    after = settled_scrape(serve_app)
    assert after["specserve:guided_compile_cache_misses_total"] == misses + 1
    assert after.get("specserve:guided_compile_cache_hits_total", 0.0) == hits
    assert after["specserve:guided_compile_seconds_count"] == compiles + 1


def test_target_side_store(serve_app, constraint):
    from deployments.guided_client import GuidedIndexStore

    fmt = OutputFormat(regex_for_format({**schema_format({
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}),
        "whitespace_pattern": ""}))
    vocab = load_guided_vocabulary(serve_app.checkpoint)

    async def fetch_twice():
        store = GuidedIndexStore(constraint)
        first, second = await asyncio.gather(store.index(fmt), store.index(fmt))
        third = await store.index(OutputFormat(fmt.regex))  # an equal format is the same key
        with pytest.raises(ValueError, match="longer than"):  # the service's error, as raised there
            await store.index(OutputFormat(SLOW_REGEX))
        return store, first, second, third

    store, first, second, third = asyncio.run(fetch_twice())
    assert first is second is third and store.fetches == 2 and store.hits == 1
    dec = CompiledFormat(first, vocab).decoder(logits_width=4096)
    forced = dec.forced_token_ids(AutoTokenizer.from_pretrained(serve_app.checkpoint))
    assert forced and dec.accept_prefix(forced) == len(forced)  # compact JSON: '{"ok":' is forced
    assert b'{"ok":'.startswith(b"".join(vocab.token_bytes[t] for t in forced))


def test_a_response_format_is_compiled_once_and_crosses_to_the_engine_once(serve_app, constraint):
    """One `response_format` from the HTTP request to the engine's mask: two identical requests
    give valid output; the ConstraintService was asked once and compiled once (the ingress no
    longer asks it), the target fetched the index once and sent it to its engine process once."""
    schema = {"type": "object", "properties": {"one_hop": {"enum": ["yes", "no"]}},
              "required": ["one_hop"]}
    target = serve_app.target_handle()
    service_before, target_before = constraint.stats.remote().result(), target.stats.remote().result()
    for _ in range(2):
        r = chat(serve_app, response_format=schema_format(schema), max_tokens=40)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    service, target_after = constraint.stats.remote().result(), target.stats.remote().result()

    def grew(after: dict, before: dict, *keys: str) -> int:
        return sum(after[k] - before[k] for k in keys)

    assert grew(service, service_before, "hits", "misses") == 1  # asked once, by the target
    assert grew(service, service_before, "compiles") == 1
    assert grew(target_after, target_before, "index_fetches") == 1
    assert grew(target_after, target_before, "formats_sent") == 1  # ("format", ...) to the engine


def test_all_compile_slots_busy_is_503(serve_app):
    """More slow formats at once than the compiler has slots (4): those that find no free slot
    within the limit get a 503 (transient), the others time out (400). Last in the module: the
    timed-out compiles keep their slots for a few seconds."""
    regexes = [f"[{a}{b}]*{a}[{a}{b}]{{14}}" for a, b in ("cd", "ef", "gh", "ij", "kl", "mn")]
    with ThreadPoolExecutor(len(regexes)) as pool:
        answers = list(pool.map(lambda rx: chat(serve_app, guided_regex=rx), regexes))
    statuses = sorted(r.status_code for r in answers)
    assert set(statuses) <= {400, 503} and 503 in statuses, [r.text for r in answers]
    for r in answers:
        error = r.json()["error"]
        if r.status_code == 503:
            assert error["type"] == "service_unavailable_error" and "retry later" in error["message"]
        else:
            assert "longer than" in error["message"], error
