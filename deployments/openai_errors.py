"""How the ingress answers what goes wrong, as OpenAI clients expect it: `{"error": {"message",
"type", "param", "code"}}` with a 4xx for the request's faults (FastAPI's 422 becomes 400), 503
when a replica it needed was lost, 500 otherwise (logged). Every 4xx is an `invalid_request_error`,
404s too, as OpenAI's are: clients tell them apart by the status and the `code`
(`model_not_found`, `previous_response_not_found`), which some act on."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.errors import REPLICA_LOST, remote_cause, replica_lost
from deployments.responses import ErrorInfo, ErrorResponse

logger = logging.getLogger("ray.serve")


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_response(status: int, message: str, type: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI answers 422; OpenAI clients expect 400 with the error body."""
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        message, param = "the request body is not valid JSON", None
    else:
        parts = []
        for e in errors[:5]:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
            parts.append(f"{where}: {e.get('msg', '')}" if where else str(e.get("msg", "")))
        message, param = "; ".join(parts), (loc[0] if loc else None)
    return error_response(400, message, param=param)


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("request failed")
    if replica_lost(exc):
        return error_response(503, REPLICA_LOST, "server_error", code="replica_unavailable")
    return error_response(500, f"internal error: {error_message(exc)}", "internal_error")


async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(exc.status_code, str(exc.detail))


def error_message(exc: BaseException) -> str:
    cause = remote_cause(exc)
    return str(cause.args[0]) if cause.args else str(cause)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _openai_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _internal_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
