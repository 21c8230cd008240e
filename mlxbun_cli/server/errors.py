"""Errors as the OpenAI error object, for every path: bad input, 404, 413, 5xx."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from mlxbun_cli.errors import MlxbunError, OptionError
from mlxbun_cli.protocols import WireError
from mlxbun_cli.protocols.openai import error_body

log = logging.getLogger("mlxbun.server")


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type, param, code), status_code=status, headers=headers)


async def wire_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, WireError)
    return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)


async def mlxbun_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MlxbunError)
    param = exc.field if isinstance(exc, OptionError) else None
    status = 400 if exc.exit_code == 2 else 500
    return error_response(
        status, exc.message, "invalid_request_error" if status == 400 else "server_error", param
    )


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = {404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large"}.get(
        exc.status_code, "invalid_request_error"
    )
    message = {404: f"no route for {request.method} {request.url.path}"}.get(
        exc.status_code, str(exc.detail)
    )
    return error_response(exc.status_code, message, kind, headers=getattr(exc, "headers", None))


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_response(500, f"internal error: {type(exc).__name__}", "server_error")
