"""Pure-ASGI middleware (streaming-safe): API key and request-body size limit."""

from __future__ import annotations

import hmac
import json
from typing import Any

Scope = dict[str, Any]


async def _send_error(
    path: str, send: Any, status: int, message: str, type: str, headers: list | None = None
) -> None:
    from mlxbun_cli.server.errors import shape_for

    body = json.dumps(shape_for(path)(message, type, None, None)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """Every route but /health needs `Authorization: Bearer KEY` (or `x-api-key`)."""

    OPEN_PATHS = ("/health",)

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in self.OPEN_PATHS
            or scope["method"] == "OPTIONS"
        ):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"")
        given = (
            auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        )
        if not hmac.compare_digest(given, self.expected):
            return await _send_error(
                scope["path"],
                send,
                401,
                "missing or wrong API key: send Authorization: Bearer KEY",
                "authentication_error",
                [(b"www-authenticate", b"Bearer")],
            )
        return await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse bodies over the limit with 413, by Content-Length or while reading."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _send_error(
                scope["path"],
                send,
                413,
                f"request body over {self.max_bytes} bytes",
                "request_too_large",
            )
        seen = 0

        async def limited_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge()
            return message

        # Only `receive` is wrapped: `send` stays direct, since every streamed
        # token passes through it.
        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            try:
                await _send_error(
                    scope["path"],
                    send,
                    413,
                    f"request body over {self.max_bytes} bytes",
                    "request_too_large",
                )
            except Exception:  # a response had already started: nothing more to say
                pass


class _TooLarge(Exception):
    pass


def install_common(app: Any, options: Any) -> None:
    """Error handlers and middleware every mlxbun app shares (engine and parent)."""
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.middleware.cors import CORSMiddleware

    from mlxbun_cli.errors import MlxbunError
    from mlxbun_cli.protocols import WireError
    from mlxbun_cli.server import errors
    from mlxbun_cli.server.disconnect import ClientGone

    app.add_exception_handler(WireError, errors.wire_error)
    app.add_exception_handler(ClientGone, errors.client_gone)
    app.add_exception_handler(MlxbunError, errors.mlxbun_error)
    app.add_exception_handler(StarletteHTTPException, errors.http_error)
    app.add_exception_handler(Exception, errors.unexpected_error)
    if options.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=options.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Warning", "X-Max-Tokens-Clamped"],
        )
    if options.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=options.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=options.max_body_bytes)
