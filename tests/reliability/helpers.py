"""Small helpers the reliability tests share (the app itself comes from conftest.py)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import requests


def target_stats(app) -> dict:
    return app.target_handle().stats.remote().result(timeout_s=60)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll until predicate() returns something truthy; fail with `what` after the deadline."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s}s (last: {last!r})")


def wait_for_idle_kv(app, timeout_s: float = 60.0) -> dict:
    """The target's stats once no request runs or waits and no KV block is held."""
    def idle():
        s = target_stats(app)
        return s if (s["num_blocks_used"], s["num_requests_running"], s["num_requests_waiting"]) == (0, 0, 0) else None
    return wait_for(idle, timeout_s, "target idle with 0 KV blocks in use")


def wait_for_running(app, n: int, timeout_s: float = 60.0) -> dict:
    return wait_for(lambda: (s := target_stats(app))["num_requests_running"] >= n and s,
                    timeout_s, f"{n} requests running in the target")


def error_of(response: requests.Response) -> dict:
    """The OpenAI error object of a response (asserting its shape)."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return body["error"]


def raw_http_request(url: str, path: str, body: dict, headers: dict | None = None) -> socket.socket:
    """Send a POST on a raw socket and return the socket without reading anything from it."""
    u = urlparse(url)
    data = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {u.hostname}:{u.port}", "Content-Type: application/json",
            f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    return sock


def sse_events(lines) -> list:
    """The JSON payloads of an SSE body (`[DONE]` kept as the string)."""
    events = []
    for line in lines:
        line = line.decode() if isinstance(line, bytes) else line
        if line.startswith("data: "):
            payload = line[6:].strip()
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
