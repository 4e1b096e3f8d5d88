"""What the ingress checks before a request reaches its route: the API key and the body.

`RequestGate` is a small ASGI middleware in front of the FastAPI app, so that it runs before
FastAPI parses anything:

- Every route but `/health`, `/ping`, `/version`, `/metrics` and `/openapi.json` (the `/v1/...`
  API, and vLLM's `/tokenize` and `/detokenize`) needs `Authorization: Bearer <key>` when API keys are
  configured (401 otherwise, before the body is read, so an unauthenticated client learns
  nothing about what it sent). Keys are compared in constant
  time and never logged.
- A body over `max_request_body_bytes` gets a 413: at once when its Content-Length says so,
  otherwise as soon as the bytes read pass the limit (chunked uploads), without buffering more.
- A JSON body that is not UTF-8 gets a 400 that says so (FastAPI would say only that it could
  not parse it).

Errors are OpenAI error bodies. The settings (`GateSettings`) hang on the FastAPI app the gate
guards (`app.state.gate`), set by the Ingress replica that serves it; until then the gate lets
everything through with the default body limit.
"""

from __future__ import annotations

import hmac
import json
import os
from dataclasses import dataclass, field

ENV_API_KEYS = "SPECSERVE_API_KEYS"
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/openapi.json"})  # no API key needed


def api_keys_from_env() -> list[str] | None:
    """The comma-separated keys in $SPECSERVE_API_KEYS, or None when it is unset or empty."""
    keys = [k.strip() for k in os.environ.get(ENV_API_KEYS, "").split(",") if k.strip()]
    return keys or None


@dataclass(frozen=True)
class GateSettings:
    api_keys: list[bytes] = field(default_factory=list)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @classmethod
    def of(cls, api_keys: list[str] | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> "GateSettings":
        return cls([k.encode() for k in api_keys or []], max_body_bytes)


def key_allowed(header: bytes | None, keys: list[bytes]) -> bool:
    if not header or not header.startswith(b"Bearer "):
        return False
    given = header[7:].strip()
    # Compare with every key (no early exit), in constant time per key.
    return bool(sum(hmac.compare_digest(given, k) for k in keys))


def _error_body(status: int, message: str, type: str, code: str | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()


async def _send_error(send, status: int, message: str, type: str = "invalid_request_error",
                      code: str | None = None, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = _error_body(status, message, type, code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class RequestGate:
    """ASGI middleware: API key, body size and body encoding, in that order."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limits = getattr(scope["app"].state, "gate", None) or GateSettings()
        headers = dict(scope.get("headers") or [])
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if limits.api_keys and path not in OPEN_PATHS:
            if not key_allowed(headers.get(b"authorization"), limits.api_keys):
                return await _send_error(
                    send, 401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                    "authentication_error", "invalid_api_key",
                    [(b"www-authenticate", b'Bearer realm="specserve"')])
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)

        limit = limits.max_body_bytes
        too_large = (f"the request body is larger than this server's limit of {limit} bytes "
                     "(max_request_body_bytes); send a shorter prompt")
        try:
            declared = int(headers.get(b"content-length", b"-1"))
        except ValueError:
            declared = -1
        if declared > limit:
            return await _send_error(send, 413, too_large, code="request_too_large")

        # Read the body (bounded by the limit), then hand it to the app in one message.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await _send_error(send, 413, too_large, code="request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        content_type = headers.get(b"content-type", b"")
        if body and b"json" in content_type:
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                return await _send_error(
                    send, 400, f"the request body is not valid UTF-8 (byte {exc.start}); "
                               "JSON must be encoded as UTF-8")

        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as before

        return await self.app(scope, replay, send)
