"""A response's id, and the ids of the engine requests behind it.

A client may name its request (vLLM's `request_id`, or the X-Request-Id header); that name
becomes the response's id. The engine's ids stay unique whatever clients send, so two clients
that send the same name do not collide.
"""

from __future__ import annotations

import uuid

from fastapi import Request

from deployments.openai_errors import OpenAIError

MAX_REQUEST_ID_CHARS = 256


def client_request_id(raw: Request, in_body: str | None) -> str | None:
    """The name a request goes by: the body's `request_id`, else the X-Request-Id header. Serve
    sets that header on every request that comes without one (its own request id, in its
    logs), so the body's field comes first here; vLLM, with no such header of its own, reads
    the header first."""
    if in_body is not None:
        return in_body
    header = raw.headers.get("x-request-id")
    if header is not None and not 0 < len(header) <= MAX_REQUEST_ID_CHARS:
        raise OpenAIError(400, f"X-Request-Id must have 1 to {MAX_REQUEST_ID_CHARS} characters")
    return header


def new_id(prefix: str, separator: str = "-") -> str:
    """A fresh id: chat's and completions' with a dash, the Responses API's (`resp_`, `msg_`)
    with an underscore."""
    return f"{prefix}{separator}{uuid.uuid4().hex}"


def response_ids(prefix: str, client_id: str | None, separator: str = "-") -> tuple[str, str]:
    """(the response's id, the base of its engine requests' ids)."""
    if client_id is None:
        response_id = new_id(prefix, separator)
        return response_id, response_id
    response_id = f"{prefix}{separator}{client_id}"
    return response_id, f"{response_id}-{uuid.uuid4().hex[:12]}"
