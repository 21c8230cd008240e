"""Forwarding a request to a model worker with the body streaming through.

Hop-by-hop headers (and those `Connection` names) are stripped; a client that
hangs up closes the upstream request, so the worker stops generating; a worker
that dies mid-stream ends the stream with the protocol's own error frame.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from mlxbun_cli.server import uds_http
from mlxbun_cli.server.errors import error_response
from mlxbun_cli.server.residency import Lease

log = logging.getLogger("mlxbun.proxy")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Never sent on to a worker: its private surface.
PARENT_ONLY_PREFIXES = ("/admin/",)


def strip_hop_by_hop(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    pairs = list(headers)
    excluded = set(HOP_BY_HOP)
    for name, value in pairs:
        if name.lower() == "connection":
            excluded.update(part.strip().lower() for part in value.split(","))
    return [(k, v) for k, v in pairs if k.lower() not in excluded]


def unavailable_frame(path: str, message: str) -> bytes:
    """The SSE error frame each protocol's own error path emits."""
    if path.startswith("/v1/messages"):
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
        return f"event: error\ndata: {json.dumps(data)}\n\n".encode()
    if path.startswith("/v1/responses"):
        data = {"type": "error", "code": "engine_unavailable", "message": message, "param": None}
        return f"event: error\ndata: {json.dumps(data)}\n\n".encode()
    data = {
        "error": {
            "message": message,
            "type": "engine_unavailable",
            "param": None,
            "code": "engine_unavailable",
        }
    }
    return f"data: {json.dumps(data)}\n\n".encode() + b"data: [DONE]\n\n"


async def open_upstream(
    request: Request, lease: Lease, body: bytes, path: str | None = None
) -> Any:
    """The worker's streaming response, or an error Response (the lease then ends)."""
    worker = lease.worker
    path = path or request.url.path
    headers = [
        (k, v)
        for k, v in strip_hop_by_hop(request.headers.items())
        if k.lower() not in ("host", "content-length")
    ]
    # The raw (still percent-encoded) path: decoded text may not be a valid URL.
    raw = request.scope.get("raw_path") or path.encode()
    target = raw.decode("ascii", "replace") + (f"?{request.url.query}" if request.url.query else "")
    try:
        return await uds_http.send(worker.socket_path, request.method, target, headers, body)
    except uds_http.UpstreamError:
        lease.release()
        return error_response(
            502,
            f"the worker for {worker.ref.id} cannot take requests ({worker.state}) — retry shortly",
            "engine_unavailable",
            code="engine_unavailable",
            path=path,
        )


async def forward(request: Request, lease: Lease, body: bytes, path: str | None = None) -> Response:
    """Send the request to the leased worker; the lease ends when the body does."""
    worker = lease.worker
    path = path or request.url.path
    upstream = await open_upstream(request, lease, body, path)
    if isinstance(upstream, Response):
        return upstream
    is_stream = upstream.headers.get("content-type", "").startswith("text/event-stream")

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except uds_http.UpstreamError as exc:
            log.warning("worker for %s failed mid-response: %s", worker.ref.id, exc)
            if is_stream:
                yield unavailable_frame(
                    path,
                    f"the worker for {worker.ref.id} stopped mid-stream ({worker.state}); "
                    "nothing was retried",
                )
        finally:
            await upstream.aclose()
            lease.release()

    response_headers = dict(
        (k, v)
        for k, v in strip_hop_by_hop(upstream.headers.items())
        if k.lower() not in ("content-length", "content-encoding")
    )
    return StreamingResponse(relay(), status_code=upstream.status_code, headers=response_headers)
