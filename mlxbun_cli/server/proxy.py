"""Forwarding a request to a model worker with the body streaming through.

Hop-by-hop headers (and those `Connection` names) are stripped; a client that
hangs up closes the upstream request, so the worker stops generating; a worker
that dies mid-stream ends the stream with the protocol's own error frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from mlxbun_cli.server import chunked, handoff, uds_http
from mlxbun_cli.server.direct_write import chunked_transport, wait_writable
from mlxbun_cli.server.disconnect import ClientGone, wait_for_disconnect
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
    request: Request,
    lease: Lease,
    body: bytes,
    path: str | None = None,
    offer: handoff.Offer | None = None,
    extra_headers: Iterable[tuple[str, str]] = (),
    whole_answer: bool = False,
) -> Any:
    """The worker's streaming response, or an error Response (the lease then ends).

    `whole_answer`: the worker answers only once it is done (not a stream), so
    a client that hangs up meanwhile is watched for."""
    worker = lease.worker
    path = path or request.url.path
    headers = [
        (k, v)
        for k, v in strip_hop_by_hop(request.headers.items())
        # the parent's own words to its workers are never a client's
        if k.lower() not in ("host", "content-length")
        and not k.lower().startswith(handoff.PRIVATE_PREFIX)
    ]
    headers += extra_headers
    if offer is not None:
        headers.append(offer.header())
    # The raw (still percent-encoded) path: decoded text may not be a valid URL.
    raw = request.scope.get("raw_path") or path.encode()
    target = raw.decode("ascii", "replace") + (f"?{request.url.query}" if request.url.query else "")
    try:
        answer = uds_http.send(worker.socket_path, request.method, target, headers, body)
        upstream = await (_unless_client_leaves(request, answer) if whole_answer else answer)
        if upstream is None:  # the client hung up: the worker saw its connection close
            lease.release()
            raise ClientGone
        if offer is not None:
            offer.accepted = upstream.headers.get(handoff.HEADER) == handoff.ACCEPT
        return upstream
    except uds_http.UpstreamError:
        lease.release()
        return error_response(
            502,
            f"the worker for {worker.ref.id} cannot take requests ({worker.state}) — retry shortly",
            "engine_unavailable",
            code="engine_unavailable",
            path=path,
        )


async def _unless_client_leaves(request: Request, answer: Any) -> Any:
    """The worker's answer, or None if the client hangs up first. A non-streamed
    answer comes only when it is complete, so without this a client that gave up
    would keep the worker busy to the end; cancelling the send closes the worker
    connection, and the worker stops the request."""
    sending = asyncio.ensure_future(answer)
    gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({sending, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if sending.done():
        return sending.result()
    sending.cancel()
    with contextlib.suppress(asyncio.CancelledError, uds_http.UpstreamError):
        await sending
    return None


async def forward(
    request: Request,
    lease: Lease,
    body: bytes,
    path: str | None = None,
    whole_answer: bool = False,
) -> Response:
    """Send the request to the leased worker; the lease ends when the body does."""
    path = path or request.url.path
    offer = handoff.Offer.for_request(request.scope, lease.worker.socket_path)
    upstream = await open_upstream(request, lease, body, path, offer, whole_answer=whole_answer)
    if isinstance(upstream, Response):
        return upstream
    is_stream = upstream.headers.get("content-type", "").startswith("text/event-stream")
    response_headers = dict(
        (k, v)
        for k, v in strip_hop_by_hop(upstream.headers.items())
        # date and server: the parent's own server adds them
        if k.lower() not in ("content-length", "content-encoding", "date", "server")
        and not k.lower().startswith(handoff.PRIVATE_PREFIX)
    )
    if is_stream and upstream.is_chunked:
        return RelayResponse(upstream, lease, path, response_headers, offer=offer)
    if offer is not None:
        offer.decline()
    return StreamingResponse(
        _relay(upstream, lease, path, is_stream),
        status_code=upstream.status_code,
        headers=response_headers,
    )


async def _relay(upstream: Any, lease: Lease, path: str, is_stream: bool) -> AsyncIterator[bytes]:
    """The worker's body, chunk by chunk, ended by an error frame if the worker fails."""
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except uds_http.UpstreamError as exc:
        if is_stream:
            yield _worker_failed(lease, path, exc)
    finally:
        await close_upstream(upstream, lease)


def _worker_failed(lease: Lease, path: str, exc: Exception) -> bytes:
    worker = lease.worker
    log.warning("worker for %s failed mid-response: %s", worker.ref.id, exc)
    return unavailable_frame(
        path,
        f"the worker for {worker.ref.id} stopped mid-stream ({worker.state}); nothing was retried",
    )


# -- the fast relay of event streams ------------------------------------------


class RelayResponse(Response):
    """A worker's event stream relayed to the client, chunk for chunk.

    The worker's chunked body is already valid framing for the client's
    chunked response, so after the headers go out through ASGI (middleware
    sees them as usual), whole chunks are written to uvicorn's transport as
    they arrive: no parsing of the events, no re-framing, and no per-token
    trip through the ASGI middleware. The end, and any error frame, go
    through ASGI again, so uvicorn finishes the response itself.

    `rewriter`, if given, may change the chunks on the way (it gets and
    returns wire-format chunks; its `finish()` gives any last payload). When
    the worker writes the body itself (`offer`, server/handoff.py), its
    response here ends with a NOTE carrying any frames this process must see.
    """

    def __init__(
        self,
        upstream: Any,
        lease: Lease,
        path: str,
        headers: dict[str, str],
        rewriter: Any = None,
        offer: handoff.Offer | None = None,
    ) -> None:
        # Not Response.__init__: that gives an empty body and a content-length.
        self.status_code = upstream.status_code
        self.background = None
        self.init_headers(headers)
        self.upstream, self.lease, self.path, self.rewriter = upstream, lease, path, rewriter
        self.offer = offer

    async def _wire_chunks(self, source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunks in source:
            if self.rewriter is not None:
                chunks = self.rewriter(chunks)
            if chunks:
                yield chunks

    async def _handed_off(
        self, source: AsyncIterator[bytes]
    ) -> tuple[bytes | None, AsyncIterator[bytes]]:
        """After a handoff: (the payload to end the body with, once the worker wrote it;
        or None and the worker's body to relay, when it relayed after all)."""
        payload = b""
        async for chunks in source:
            payload += chunked.chunk_payloads(chunks)
            if len(payload) >= len(handoff.NOTE) or not handoff.NOTE.startswith(payload):
                break
        if not payload.startswith(handoff.NOTE):
            handoff.stats["missed"] += 1
            # What was read is the start of the worker's body.
            return None, _prepend(chunked.frame_chunk(payload), source) if payload else source
        handoff.stats["given"] += 1
        async for chunks in source:
            payload += chunked.chunk_payloads(chunks)
        frames = payload[len(handoff.NOTE) :]
        if frames and self.rewriter is not None:  # e.g. the finished response, stored first
            frames = chunked.chunk_payloads(self.rewriter(chunked.frame_chunk(frames)))
            frames += self.rewriter.finish()
        return frames, source

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        # A client that hangs up closes the upstream at once (the worker then
        # cancels), even while no chunk is coming: queued, prefilling.
        client_left = asyncio.Event()
        watcher = asyncio.create_task(self._watch_disconnect(receive, client_left))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            # None when not served by uvicorn or not chunked: ASGI frames the payloads.
            transport = chunked_transport(scope)
            # From here the worker may write the body to the client itself.
            handed = self.offer is not None and self.offer.give(scope, transport)
            source = self.upstream.raw_chunks()
            tail = b""
            try:
                if handed:
                    frames, source = await self._handed_off(source)
                    if frames is not None:
                        await send(
                            {"type": "http.response.body", "body": frames, "more_body": False}
                        )
                        return
                async for chunks in self._wire_chunks(source):
                    if transport is None:
                        body = chunked.chunk_payloads(chunks)
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                        continue
                    if transport.is_closing():
                        return
                    transport.write(chunks)
                    if not await wait_writable(transport):
                        return
                tail = self.rewriter.finish() if self.rewriter is not None else b""
            except uds_http.UpstreamError as exc:
                if client_left.is_set():
                    return
                tail = _worker_failed(self.lease, self.path, exc)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            watcher.cancel()
            if self.offer is not None:
                self.offer.decline()  # no-op once answered; else the worker stops waiting
            await close_upstream(self.upstream, self.lease)

    async def _watch_disconnect(self, receive: Any, client_left: asyncio.Event) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        client_left.set()
        self.upstream.abort()


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for item in rest:
        yield item


async def close_upstream(upstream: Any, lease: Lease) -> None:
    """Close the worker connection; the lease ends even if closing is interrupted."""
    try:
        await upstream.aclose()
    finally:
        lease.release()
