"""Cancellation reaches the engine: a client that goes away without ever reading its response
(streaming or not, one choice or several) has its engine requests aborted and their KV blocks
freed, long before they could have run to max_tokens.

tests/serve/test_openai_api.py covers the client that reads a few chunks of a stream and then
closes it; here nothing of the response is read, so the server only learns of it from the
closed connection.
"""

from __future__ import annotations

import socket
import struct

import pytest
import requests

from .helpers import raw_http_request, target_stats, wait_for_idle_kv, wait_for_running

pytestmark = pytest.mark.slow

MAX_TOKENS = 1500  # far more than can be generated between "running" and the close


@pytest.mark.parametrize("stream,n,reset", [(True, 1, False), (False, 1, False), (True, 3, True)],
                         ids=["stream-closed", "non-stream-closed", "stream-n3-reset"])
def test_client_that_never_reads_is_aborted_and_its_kv_freed(serve_app, stream, n, reset):
    wait_for_idle_kv(serve_app)
    before = target_stats(serve_app)
    sock = raw_http_request(serve_app.url, "/v1/completions", {
        "model": serve_app.model, "prompt": "def fibonacci(n):", "max_tokens": MAX_TOKENS, "n": n,
        "temperature": 0.7, "seed": 1, "stream": stream, "ignore_eos": True})
    try:
        running = wait_for_running(serve_app, n)
        assert running["num_blocks_used"] > 0, running
    finally:
        if reset:  # an abortive close (RST), as a crashed client or a dropped connection gives
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    after = wait_for_idle_kv(serve_app)
    generated = after["generation_tokens"] - before["generation_tokens"]
    # Aborted, not run to completion: far fewer tokens than the n x max_tokens asked for.
    assert generated < n * MAX_TOKENS // 2, (before, after)


def test_server_serves_after_abandoned_requests(serve_app):
    r = requests.post(serve_app.url + "/v1/completions", timeout=60,
                      json={"prompt": "hello", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    wait_for_idle_kv(serve_app)
