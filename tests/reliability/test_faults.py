"""Faults: the target replica is killed (`ray.kill`) while requests run on it. The requests on
it end with an error, never a hang (streaming: an in-band error event, then `[DONE]`;
non-streaming: a 503 with an OpenAI error body) that says what happened without Ray's
internals; Serve starts a replacement and new requests are served by it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from deployments.errors import REPLICA_LOST

from tests.procfs import engine_processes, replica_stages

from .helpers import sse_events, target_stats, wait_for, wait_for_idle_kv, wait_for_running

pytestmark = pytest.mark.slow

CLIENT_TIMEOUT_S = 120  # a request still open after this counts as hung


def replica_actor(replica_id: str):
    """The Ray actor of the Serve replica with this id (Serve names the actor after it)."""
    import ray

    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].endswith("#" + replica_id)]
    assert len(names) == 1, names
    return ray.get_actor(names[0]["name"], namespace=names[0]["namespace"])


def in_flight(url: str, model: str, stream: bool, started: threading.Event) -> dict:
    """A long completion; `started` is set once its response has begun (a stream's status and
    headers, which go out with its first chunk; a whole response's end)."""
    body = {"model": model, "prompt": "A long story:", "max_tokens": 1500, "stream": stream,
            "ignore_eos": True, "temperature": 0.8, "seed": 3}
    try:
        with requests.post(url + "/v1/completions", json=body, stream=stream,
                           timeout=(10, CLIENT_TIMEOUT_S)) as r:
            started.set()
            if stream:
                return {"status": r.status_code, "events": sse_events(r.iter_lines())}
            return {"status": r.status_code, "json": r.json()}
    except requests.Timeout as exc:
        return {"hung": repr(exc)}


def start_requests(pool: ThreadPoolExecutor, serve_app, kinds: list[bool]) -> list:
    """The requests of `kinds` (streaming or not), once all run in the target and the streams have
    begun: a stream killed before its first chunk is answered as a whole response is, a 503."""
    started = [threading.Event() for _ in kinds]
    futures = [pool.submit(in_flight, serve_app.url, serve_app.model, s, e) for s, e in zip(kinds, started)]
    wait_for_running(serve_app, len(kinds))
    assert all(e.wait(60) for s, e in zip(kinds, started) if s), "a stream did not begin"
    return futures


def test_killed_target_replica_fails_its_requests_and_is_replaced(serve_app):
    import ray

    wait_for_idle_kv(serve_app)
    old_replica = target_stats(serve_app)["replica_id"]
    kinds = [True, True, False, False]  # streaming, streaming, non-streaming, non-streaming
    with ThreadPoolExecutor(len(kinds)) as pool:
        futures = start_requests(pool, serve_app, kinds)
        ray.kill(replica_actor(old_replica), no_restart=True)
        results = [f.result() for f in futures]

    for stream, result in zip(kinds, results):
        assert "hung" not in result, result
        if stream:
            assert result["status"] == 200, result  # the stream had started
            events = result["events"]
            assert events[-1] == "[DONE]", events[-3:]
            errors = [e for e in events[:-1] if isinstance(e, dict) and "error" in e]
            assert len(errors) == 1, events[-3:]
            assert errors[0]["error"]["message"] == REPLICA_LOST, errors  # no actor ids, pids, addresses
            # The stream did not also claim to have finished normally.
            assert not any(c.get("finish_reason") for e in events[:-1] if isinstance(e, dict)
                           for c in e.get("choices", [])), events[-3:]
        else:
            assert result["status"] == 503, result
            error = result["json"]["error"]
            assert set(error) >= {"message", "type", "param", "code"}, result
            assert error["message"] == REPLICA_LOST and error["code"] == "replica_unavailable", error

    # Serve replaces the replica; new requests are served (by the new one).
    def served():
        try:
            r = requests.post(serve_app.url + "/v1/completions", timeout=CLIENT_TIMEOUT_S,
                              json={"prompt": "Back again", "max_tokens": 5, "ignore_eos": True})
        except requests.RequestException:
            return None
        return r if r.status_code == 200 else None

    r = wait_for(served, 180, "a request served after the replica was killed", interval_s=1)
    assert r.json()["usage"]["completion_tokens"] == 5
    stats = wait_for_idle_kv(serve_app)
    assert stats["replica_id"] != old_replica


def engine_process_of_target(app_name: str) -> int:
    """The pid of the engine process this app's TargetModel replica started."""
    targets = {pid for pid, stage in replica_stages(app_name).items() if stage == "TargetModel"}
    engines = [pid for pid, parent in engine_processes().items() if parent in targets]
    assert len(engines) == 1, (targets, engines)
    return engines[0]


def test_killed_engine_process_fails_its_requests_and_the_replica_is_replaced(serve_app):
    """The engine runs in a child process of the replica: if it dies (OOM killer, a crash in a
    kernel), the requests on it end as if the replica had been lost, and the replica fails its
    health check so that Serve replaces it."""
    import os
    import signal

    wait_for_idle_kv(serve_app)
    old_replica = target_stats(serve_app)["replica_id"]
    kinds = [True, False]  # streaming, non-streaming
    with ThreadPoolExecutor(len(kinds)) as pool:
        futures = start_requests(pool, serve_app, kinds)
        os.kill(engine_process_of_target(serve_app.name), signal.SIGKILL)
        streamed, whole = [f.result() for f in futures]

    assert "hung" not in streamed and "hung" not in whole, (streamed, whole)
    events = streamed["events"]
    assert streamed["status"] == 200 and events[-1] == "[DONE]", events[-3:]
    errors = [e for e in events[:-1] if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0]["error"]["message"] == REPLICA_LOST, events[-3:]
    assert whole["status"] == 503, whole
    assert whole["json"]["error"]["message"] == REPLICA_LOST, whole

    def replaced():
        try:
            stats = target_stats(serve_app)
        except Exception:  # noqa: BLE001 - the old replica is going away
            return None
        return stats if stats["replica_id"] != old_replica else None

    wait_for(replaced, 180, "a new target replica after the engine process was killed", interval_s=1)
    r = requests.post(serve_app.url + "/v1/completions", timeout=CLIENT_TIMEOUT_S,
                      json={"prompt": "Back again", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
