"""Bad input gets a 4xx with an OpenAI error body that names the problem, and the server keeps
serving; a schemathesis fuzz run over the app's own OpenAPI schema finds no 5xx.

tests/serve/test_openai_api.py already covers: malformed JSON and a wrong type on
/v1/completions, a missing prompt, temperature < 0, n = 0, an unknown model, a prompt at
max_model_len, prompt + max_tokens over it, an out-of-vocabulary token id, empty `messages`,
and two response_format cases. The table below is the rest of issue 7's list.
"""

from __future__ import annotations

import time

import pytest
import requests

from .helpers import error_of, wait_for_idle_kv

pytestmark = pytest.mark.slow

BODY_LIMIT = 64 * 1024
# A short context keeps the fuzz run's valid requests cheap; a small body limit makes 413 cheap.
SERVE_APP_ARGS = {"max_model_len": 256, "max_request_body_bytes": BODY_LIMIT}

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
PARAMS_NAMED = {"priority"}  # cases whose error must name the field as its `param`
USER = [{"role": "user", "content": "hi"}]


def _chunked(data: bytes, size: int = 8192):
    for i in range(0, len(data), size):
        yield data[i:i + size]


# (id, path, request kwargs, status, a word the message or param must contain)
CASES = [
    ("chat-malformed-json", CHAT, dict(data=b'{"messages": [', headers={"content-type": "application/json"}), 400, "JSON"),
    ("json-array-body", COMPLETIONS, dict(json=[1, 2, 3]), 400, "dict"),
    ("invalid-utf8", COMPLETIONS, dict(data=b'{"prompt": "caf\xe9 \xff", "max_tokens": 2}',
                                       headers={"content-type": "application/json"}), 400, "UTF-8"),
    ("body-over-limit", COMPLETIONS, dict(json={"prompt": "a" * (BODY_LIMIT + 10)}), 413, "limit"),
    ("chunked-body-over-limit", COMPLETIONS, dict(data=_chunked(b'{"prompt": "' + b"a" * (2 * BODY_LIMIT) + b'"}'),
                                                  headers={"content-type": "application/json"}), 413, "limit"),
    ("prompt-wrong-type", COMPLETIONS, dict(json={"prompt": {"text": "x"}}), 400, "prompt"),
    ("chat-content-wrong-type", CHAT, dict(json={"messages": [{"role": "user", "content": 5}]}), 400, "content"),
    ("chat-unknown-role", CHAT, dict(json={"messages": [{"role": "robot", "content": "x"}]}), 400, "role"),
    ("empty-prompt", COMPLETIONS, dict(json={"prompt": ""}), 400, "empty"),
    ("empty-prompt-in-batch", COMPLETIONS, dict(json={"prompt": ["fine", ""]}), 400, "empty"),
    ("empty-token-prompt-in-batch", COMPLETIONS, dict(json={"prompt": [[5, 6], []]}), 400, "empty"),
    ("chat-prompt-over-max-model-len", CHAT, dict(json={"messages": [{"role": "user", "content": "word " * 400}]}),
     400, "context length"),
    ("chat-prompt-plus-max-tokens-over", CHAT, dict(json={"messages": USER, "max_tokens": 256}), 400, "context length"),
    ("max-tokens-zero", COMPLETIONS, dict(json={"prompt": "x", "max_tokens": 0}), 400, "max_tokens"),
    ("max-tokens-negative", COMPLETIONS, dict(json={"prompt": "x", "max_tokens": -5}), 400, "max_tokens"),
    ("chat-max-completion-tokens-zero", CHAT, dict(json={"messages": USER, "max_completion_tokens": 0}), 400,
     "max_completion_tokens"),
    ("chat-temperature-negative", CHAT, dict(json={"messages": USER, "temperature": -0.1}), 400, "temperature"),
    ("top-p-zero", COMPLETIONS, dict(json={"prompt": "x", "top_p": 0}), 400, "top_p"),
    ("top-p-over-one", COMPLETIONS, dict(json={"prompt": "x", "top_p": 1.5}), 400, "top_p"),
    ("n-too-large", COMPLETIONS, dict(json={"prompt": "x", "n": 17}), 400, "n"),
    ("chat-n-too-large", CHAT, dict(json={"messages": USER, "n": 1000}), 400, "n"),
    ("stop-not-a-string", COMPLETIONS, dict(json={"prompt": "x", "stop": 5}), 400, "stop"),
    ("stop-list-of-ints", COMPLETIONS, dict(json={"prompt": "x", "stop": [1, 2]}), 400, "stop"),
    ("stop-empty-string", COMPLETIONS, dict(json={"prompt": "x", "stop": [""]}), 400, "stop"),
    ("stop-too-many", CHAT, dict(json={"messages": USER, "stop": [f"s{i}" for i in range(17)]}), 400, "stop"),
    ("seed-over-int64", COMPLETIONS, dict(json={"prompt": "x", "seed": 2 ** 64}), 400, "seed"),
    ("response-format-unknown-type", CHAT, dict(json={"messages": USER, "response_format": {"type": "xml"}}), 400,
     "response_format"),
    ("response-format-schema-not-object", CHAT, dict(json={
        "messages": USER, "response_format": {"type": "json_schema", "json_schema": {"schema": "nope"}}}),
     400, "response_format"),
    ("response-format-not-object", COMPLETIONS, dict(json={"prompt": "x", "response_format": "json"}), 400,
     "response_format"),
    ("min-tokens-negative", COMPLETIONS, dict(json={"prompt": "x", "min_tokens": -1}), 400, "min_tokens"),
    ("min-tokens-over-max-tokens", COMPLETIONS, dict(json={"prompt": "x", "max_tokens": 4, "min_tokens": 5}), 400,
     "min_tokens"),
    ("min-tokens-with-beam-search", COMPLETIONS, dict(json={"prompt": "x", "best_of": 2, "use_beam_search": True,
                                                            "min_tokens": 2}), 400, "min_tokens"),
    ("truncate-prompt-tokens-zero", COMPLETIONS, dict(json={"prompt": "x", "truncate_prompt_tokens": 0}), 400,
     "truncate_prompt_tokens"),
    ("truncate-prompt-tokens-below-minus-one", CHAT, dict(json={"messages": USER, "truncate_prompt_tokens": -2}),
     400, "truncate_prompt_tokens"),
    ("allowed-token-ids-empty", COMPLETIONS, dict(json={"prompt": "x", "allowed_token_ids": []}), 400,
     "allowed_token_ids"),
    ("allowed-token-id-outside-the-vocabulary", CHAT, dict(json={"messages": USER, "allowed_token_ids": [1, 10 ** 9]}),
     400, "allowed_token_ids"),
    ("chat-template-kwargs-set-tokenize", CHAT, dict(json={"messages": USER, "chat_template_kwargs": {"tokenize": True}}),
     400, "chat_template_kwargs"),
    ("chat-continue-and-open-a-turn", CHAT, dict(json={"messages": USER, "continue_final_message": True}), 400,
     "continue_final_message"),
    ("cache-salt-empty", COMPLETIONS, dict(json={"prompt": "x", "cache_salt": ""}), 400, "cache_salt"),
    ("bad-words-empty", COMPLETIONS, dict(json={"prompt": "x", "bad_words": [" "]}), 400, "bad_words"),
    ("priority-without-a-priority-policy", CHAT, dict(json={"messages": USER, "priority": 1}), 400, "priority"),
    ("logits-processors", COMPLETIONS, dict(json={"prompt": "x", "logits_processors": ["my.module:Processor"]}), 400,
     "logits_processors"),
    ("a-requests-own-chat-template", CHAT, dict(json={"messages": USER, "chat_template": "{{ messages }}"}), 400,
     "chat_template"),
    ("request-id-header-too-long", CHAT, dict(json={"messages": USER}, headers={"X-Request-Id": "x" * 300}), 400,
     "X-Request-Id"),
    ("response-input-empty", RESPONSES, dict(json={"input": []}), 400, "input"),
    ("response-unknown-previous", RESPONSES, dict(json={"input": "x", "previous_response_id": "resp_1"}), 400,
     "previous_response_id"),
    ("response-stored-conversation", RESPONSES, dict(json={"input": "x", "conversation": "conv_1"}), 400,
     "conversation"),
    ("response-background-not-stored", RESPONSES, dict(json={"input": "x", "background": True, "store": False}),
     400, "background"),
    ("response-unknown-item-reference", RESPONSES, dict(json={"input": [{"type": "item_reference", "id": "msg_1"}]}),
     400, "input"),
]


@pytest.mark.parametrize("path,kwargs,status,word", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_gets_a_4xx_naming_the_problem(serve_app, path, kwargs, status, word):
    r = requests.post(serve_app.url + path, timeout=60, **kwargs)
    assert r.status_code == status, (r.status_code, r.text[:500])
    error = error_of(r)
    assert error["type"] == "invalid_request_error", error
    assert word.lower() in f"{error['message']} {error['param']}".lower(), error
    if word in PARAMS_NAMED:
        assert error["param"] == word, error


def test_edge_values_are_served_not_crashed(serve_app):
    """Values at the edge of the valid range (found by the fuzz run): a temperature so small
    that logits / t overflows is greedy (vLLM's convention), and seeds over the whole int64 range
    work for every choice (the ingress seeds choice j with seed + j)."""
    post = lambda body: requests.post(serve_app.url + COMPLETIONS, timeout=60,  # noqa: E731
                                      json={"prompt": "Once upon a time", "max_tokens": 8, **body})
    greedy = post({"temperature": 0})
    tiny = post({"temperature": 1e-300})
    assert greedy.status_code == tiny.status_code == 200, (greedy.text, tiny.text)
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    for seed in (2 ** 63 - 1, -(2 ** 63)):
        r = post({"seed": seed, "n": 3, "temperature": 1.0})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 3


@pytest.mark.parametrize("method,path,kwargs,code", [
    ("POST", CHAT, dict(json={"messages": USER, "model": "another-model"}), "model_not_found"),
    ("GET", RESPONSES + "/resp_1", {}, None),
    ("DELETE", RESPONSES + "/resp_1", {}, None),
    ("POST", RESPONSES + "/resp_1/cancel", {}, None),
    ("GET", "/v1/no-such-route", {}, None),
], ids=["unknown-model", "unknown-response", "delete-unknown-response", "cancel-unknown-response",
        "unknown-route"])
def test_what_is_not_there_is_a_404_as_openai_writes_it(serve_app, method, path, kwargs, code):
    """OpenAI's 404s are `invalid_request_error`s like its 400s, told apart by status and code."""
    r = requests.request(method, serve_app.url + path, timeout=60, **kwargs)
    assert r.status_code == 404, (r.status_code, r.text[:500])
    error = error_of(r)
    assert (error["type"], error["code"]) == ("invalid_request_error", code), error


def test_server_healthy_after_bad_input(serve_app):
    """Runs after the table: the replica that saw all of it still serves, and nothing leaked."""
    assert requests.get(serve_app.url + "/health", timeout=30).status_code == 200
    r = requests.post(serve_app.url + COMPLETIONS, timeout=60, json={"prompt": "still here", "max_tokens": 3,
                                                                      "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    wait_for_idle_kv(serve_app)


FUZZ_EXAMPLES_PER_MODE = 15  # per operation: positive (schema-valid) and negative (schema-invalid)
FUZZ_DEADLINE_S = 180


@pytest.mark.timeout(FUZZ_DEADLINE_S + 120)
def test_schemathesis_fuzz_finds_no_server_errors(serve_app):
    """Positive and negative cases for every operation of /openapi.json, derandomized so CI
    runs the same cases each time; every answer must be < 500, and every 4xx an OpenAI error."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings

    spec = requests.get(serve_app.url + "/openapi.json", timeout=30)
    assert spec.status_code == 200, spec.text
    schema = schemathesis.openapi.from_dict(spec.json())
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {(op.method.upper(), op.path) for op in operations}
    assert {("POST", COMPLETIONS), ("POST", CHAT), ("GET", "/v1/models")} <= paths, paths

    deadline = time.monotonic() + FUZZ_DEADLINE_S
    calls: dict[str, int] = {}
    failures: list[str] = []
    session = requests.Session()
    for op in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            if not op.body and mode == schemathesis.GenerationMode.NEGATIVE:
                continue  # no body to get wrong (GET, DELETE, a cancel), and any string is a well-formed path id

            @settings(max_examples=FUZZ_EXAMPLES_PER_MODE, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):
                if time.monotonic() > deadline:
                    return
                response = case.call(base_url=serve_app.url, session=session, timeout=120)
                key = f"{op.method.upper()} {op.path} {mode.value}"
                calls[key] = calls.get(key, 0) + 1
                where = f"{key}: {response.status_code} {response.text[:300]!r}\n  {case.as_curl_command()}"
                if response.status_code >= 500:
                    failures.append(where)
                elif response.status_code >= 400:
                    try:
                        error_of(response)
                    except (AssertionError, ValueError):
                        failures.append("not an OpenAI error body: " + where)

            run()
    assert not failures, "\n".join(failures)
    # The run really exercised the generating routes, both ways (not cut short by the deadline).
    for path in (COMPLETIONS, CHAT):
        for mode in ("positive", "negative"):
            assert calls.get(f"POST {path} {mode}", 0) >= FUZZ_EXAMPLES_PER_MODE // 2, calls
    assert requests.get(serve_app.url + "/health", timeout=30).status_code == 200
    wait_for_idle_kv(serve_app)
