"""API keys: from the config (`api_keys`) or, when the config sets none, from
$SPECSERVE_API_KEYS. Every /v1 route, /tokenize and /detokenize answer 401 (OpenAI body) without
a key, with a wrong one or with another scheme, before they look at the body; 200 with a key;
/health, /ping, /version and /metrics stay open; and no key, right or wrong, appears in any log of the Ray
session."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import openai
import pytest
import requests

from .helpers import error_of, wait_for

pytestmark = pytest.mark.slow

KEYS = [f"sk-test-{uuid.uuid4().hex}", f"sk-other-{uuid.uuid4().hex}"]
WRONG_KEY = f"sk-wrong-{uuid.uuid4().hex}"
SERVE_APP_ARGS: dict = {}  # no api_keys in the config: they come from the environment


@pytest.fixture(scope="module", autouse=True)
def keys_in_environment():
    """build_app (run by the serve_app fixture) reads the keys from the environment."""
    old = os.environ.get("SPECSERVE_API_KEYS")
    os.environ["SPECSERVE_API_KEYS"] = " , ".join(KEYS)
    yield
    if old is None:
        os.environ.pop("SPECSERVE_API_KEYS")
    else:
        os.environ["SPECSERVE_API_KEYS"] = old


ROUTES = [("GET", "/v1/models", None), ("GET", "/v1/models/tiny-target", None),
          ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
          ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
          ("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [5, 6]})]
BAD_AUTH = {"no header": {}, "wrong key": {"Authorization": f"Bearer {WRONG_KEY}"},
            "basic scheme": {"Authorization": f"Basic {KEYS[0]}"},
            "key without scheme": {"Authorization": KEYS[0]}, "empty bearer": {"Authorization": "Bearer "}}


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[r[1] for r in ROUTES])
def test_every_route_needs_a_key(serve_app, method, path, body):
    for what, headers in BAD_AUTH.items():
        r = requests.request(method, serve_app.url + path, json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (what, r.status_code, r.text)
        error = error_of(r)
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key", error
        assert WRONG_KEY not in r.text and KEYS[0] not in r.text
    for key in KEYS:
        r = requests.request(method, serve_app.url + path, json=body, timeout=60,
                             headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text


def test_key_is_checked_before_the_body(serve_app):
    """An unauthenticated client learns nothing about its body: not even that it is too big or bad."""
    for data in (b"{not json", b"x" * (9 * 1024 * 1024)):
        r = requests.post(serve_app.url + "/v1/completions", data=data, timeout=60,
                          headers={"content-type": "application/json"})
        assert r.status_code == 401, r.text[:300]


def test_openai_client_with_and_without_key(serve_app):
    good = openai.OpenAI(base_url=serve_app.base_url, api_key=KEYS[1], max_retries=0, timeout=60)
    assert good.completions.create(model=serve_app.model, prompt="x", max_tokens=2).choices
    bad = openai.OpenAI(base_url=serve_app.base_url, api_key=WRONG_KEY, max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=serve_app.model, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_health_and_metrics_stay_open(serve_app):
    for path in ("/health", "/ping", "/version", "/metrics"):
        assert requests.get(serve_app.url + path, timeout=30).status_code == 200, path


def test_keys_are_never_logged(serve_app):
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())

    def log_text() -> str:
        return "\n".join(p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file())

    # The logs we search are the ones this app writes to: its ingress logged the 401s above
    # (Serve's access log names the route and the status) before we look for the keys.
    wait_for(lambda: any("401" in line and "/v1/" in line for line in log_text().splitlines()),
             60, "the ingress's access log lines for the 401s in the session's logs")
    text = log_text()
    for secret in (*KEYS, WRONG_KEY):
        assert secret not in text, f"a key appears in the logs under {logs}"


def test_config_keys_win_over_the_environment(monkeypatch):
    from deployments.app_args import AppArgs
    from deployments.builder import api_keys

    monkeypatch.setenv("SPECSERVE_API_KEYS", "env-1, env-2,")
    assert api_keys(AppArgs(model="m", api_keys="cfg-1,cfg-2")) == ["cfg-1", "cfg-2"]
    assert api_keys(AppArgs(model="m")) == ["env-1", "env-2"]
    monkeypatch.setenv("SPECSERVE_API_KEYS", "")
    assert api_keys(AppArgs(model="m")) is None
