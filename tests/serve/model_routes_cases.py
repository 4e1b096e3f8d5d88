"""The routes beside the API's: OpenAI's `GET /v1/models/{id}` (`client.models.retrieve`), and
vLLM's `/ping` and `/version`.

Imported by tests/serve/test_openai_api.py so that they run against that module's app."""

from __future__ import annotations

import importlib.metadata

import openai
import pytest
import requests


def test_the_one_model_by_its_id_ping_and_version(serve_app, client):
    assert client.models.retrieve(serve_app.model) == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("org/another-model")
    assert info.value.body["code"] == "model_not_found" and "org/another-model" in info.value.body["message"]
    assert [requests.request(m, serve_app.url + "/ping", timeout=30).status_code for m in ("GET", "POST")] == [200, 200]
    assert requests.get(serve_app.url + "/version", timeout=30).json()["version"] == \
        importlib.metadata.version("specserve")
