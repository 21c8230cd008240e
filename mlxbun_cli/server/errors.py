"""Errors in each wire's own shape (OpenAI by default), for every path: 4xx and 5xx."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from mlxbun_cli.errors import MlxbunError
from mlxbun_cli.protocols import WireError
from mlxbun_cli.protocols.openai import error_body

log = logging.getLogger("mlxbun.server")


ErrorShape = Callable[[str, str, "str | None", "str | None"], dict[str, Any]]

# Each wire answers errors in its own shape; routes register theirs by path prefix.
ERROR_SHAPES: dict[str, ErrorShape] = {}


def register_error_shape(prefix: str, shape: ErrorShape) -> None:
    ERROR_SHAPES[prefix] = shape


def shape_for(path: str | None) -> ErrorShape:
    for prefix, shape in ERROR_SHAPES.items():
        if path and path.startswith(prefix):
            return shape
    return error_body


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
    path: str | None = None,
) -> JSONResponse:
    """The error object in the shape of the wire `path` belongs to (OpenAI by default)."""
    body = shape_for(path)(message, type, param, code)
    return JSONResponse(body, status_code=status, headers=headers)


async def wire_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, WireError)
    return error_response(
        exc.status, exc.message, exc.type, exc.param, exc.code, path=request.url.path
    )


async def mlxbun_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MlxbunError)
    param = getattr(exc, "field", None)
    status = 400 if exc.exit_code == 2 else 500
    kind = "invalid_request_error" if status == 400 else "server_error"
    code = getattr(exc, "code", None)
    return error_response(status, exc.message, kind, param, code, path=request.url.path)


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = {404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large"}.get(
        exc.status_code, "invalid_request_error"
    )
    message = {404: f"no route for {request.method} {request.url.path}"}.get(
        exc.status_code, str(exc.detail)
    )
    return error_response(
        exc.status_code, message, kind, headers=getattr(exc, "headers", None), path=request.url.path
    )


async def client_gone(request: Request, exc: Exception) -> JSONResponse:
    """Nobody is left to read it; the status is for the access log (nginx's 499)."""
    state = getattr(request.app.state, "mlxbun", None)
    if state is not None:
        state.counters.client_disconnects += 1
    return error_response(
        499, "the client closed the request", "client_closed", path=request.url.path
    )


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_response(
        500, f"internal error: {type(exc).__name__}", "server_error", path=request.url.path
    )
