"""The Responses history, kept by the isolated parent so it survives worker restarts.

The parent resolves `previous_response_id` against its own store, sends the
worker the whole conversation with no previous id and `store: false`, and
stores the completed response it relays back.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from mlxbun_cli.protocols import JSON_ERRORS, WireError
from mlxbun_cli.protocols import responses as wire
from mlxbun_cli.server import chunked, handoff
from mlxbun_cli.server.proxy import RelayResponse, close_upstream, unavailable_frame
from mlxbun_cli.server.responses_store import ResponseStore

Lease = Any
LeaseFor = Callable[[Request, dict[str, Any]], Awaitable["Lease | Response"]]


def _read_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except JSON_ERRORS as exc:
        raise WireError(f"the body is not valid JSON: {exc}") from exc


def build_responses_router(store: ResponseStore, lease_for: LeaseFor, send: Callable) -> APIRouter:
    from mlxbun_cli.server.routes_responses import RESPONSES_BODY, _not_found

    api = APIRouter()

    @api.post("/v1/responses", openapi_extra=RESPONSES_BODY, summary="Create a response")
    async def create(request: Request) -> Response:
        body = wire.check_container(_read_json(await request.body()))  # 400s before any lookup
        previous = body.get("previous_response_id")
        conversation: list[dict[str, Any]] = []
        if previous is not None:
            record = store.get(previous)
            if record is None:
                raise _not_found(previous, "previous_response_id", "previous_response_not_found")
            conversation = record.items + record.response["output"]
        parsed = wire.parse_request(body)  # every other 400, after the lookup (seed order)
        items, keep = parsed.items, parsed.store
        upstream_body = {k: v for k, v in body.items() if k != "previous_response_id"}
        upstream_body.update(input=conversation + items, store=False)
        lease = await lease_for(request, body)
        if isinstance(lease, Response):
            return lease
        raw = json.dumps(upstream_body).encode()

        def remember(response: dict[str, Any]) -> dict[str, Any]:
            response["previous_response_id"] = previous
            response["store"] = keep
            if keep and response.get("status") in ("completed", "incomplete"):
                store.put(response, conversation + items)
            return response

        # A stream may be written by the worker straight to the client: it then shows
        # the history fields itself and hands back only the finished response.
        worker_socket = lease.worker.socket_path
        offer = handoff.Offer.for_request(request.scope, worker_socket) if parsed.stream else None
        shown = json.dumps({"previous_response_id": previous, "store": keep})
        extra = [(handoff.SHOWN_HEADER, shown)] if offer is not None else []
        upstream = await send(request, lease, raw, offer, extra, whole_answer=not parsed.stream)
        if isinstance(upstream, Response):
            return upstream
        if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
            if offer is not None:
                offer.decline()
            try:
                data = json.loads(await upstream.aread())
            finally:
                await close_upstream(upstream, lease)
            if (
                upstream.status_code == 200
                and isinstance(data, dict)
                and data.get("object") == "response"
            ):
                data = remember(data)
            return JSONResponse(data, status_code=upstream.status_code)
        if upstream.is_chunked:
            return RelayResponse(
                upstream,
                lease,
                "/v1/responses",
                {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"},
                rewriter=ResponseObjectRewriter(previous, remember),
                offer=offer,
            )
        if offer is not None:
            offer.decline()
        return StreamingResponse(
            _relay(upstream, lease, previous, remember),
            status_code=upstream.status_code,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    @api.get("/v1/responses/{response_id}", summary="Retrieve a stored response")
    async def get(response_id: str) -> JSONResponse:
        record = store.get(response_id)
        if record is None:
            raise _not_found(response_id)
        return JSONResponse(record.response)

    @api.delete("/v1/responses/{response_id}", summary="Delete a stored response")
    async def delete(response_id: str) -> JSONResponse:
        if not store.delete(response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    return api


async def _relay(
    upstream: Any, lease: Lease, previous: str | None, remember: Callable
) -> AsyncIterator[bytes]:
    """Pass events through; patch the response objects and store the finished one."""
    from mlxbun_cli.server.uds_http import UpstreamError

    buffer = b""
    try:
        async for chunk in upstream.aiter_raw():
            buffer += chunk
            while b"\n\n" in buffer:
                frame, buffer = buffer.split(b"\n\n", 1)
                yield _patch(frame, previous, remember) + b"\n\n"
        if buffer:
            yield buffer
    except UpstreamError:
        yield unavailable_frame(
            "/v1/responses", "the model's worker stopped mid-stream; nothing was retried"
        )
    finally:
        await close_upstream(upstream, lease)


class ResponseObjectRewriter:
    """Patches the events that carry the response object, in relayed chunks.

    Token deltas (almost every chunk) carry no `"response"` key and pass
    through untouched; a chunk that has one is unframed, its events patched
    (and the finished response stored), and framed again.
    """

    def __init__(self, previous: str | None, remember: Callable) -> None:
        self.previous, self.remember = previous, remember
        self._carry = b""  # an event split across chunks

    def __call__(self, wire: bytes) -> bytes:
        if not self._carry and b'"response"' not in wire and wire.endswith(b"\n\n\r\n"):
            return wire  # whole events (the chunk ends on an event boundary), none to patch
        data = self._carry + chunked.chunk_payloads(wire)
        *frames, self._carry = data.split(b"\n\n")
        patched = b"".join(_patch(f, self.previous, self.remember) + b"\n\n" for f in frames)
        return chunked.frame_chunk(patched)

    def finish(self) -> bytes:
        rest, self._carry = self._carry, b""
        return rest


def _patch(frame: bytes, previous: str | None, remember: Callable) -> bytes:
    lines = frame.split(b"\n")
    for i, line in enumerate(lines):
        if not line.startswith(b"data: "):
            continue
        try:
            data = json.loads(line[6:])
        except ValueError:
            return frame
        response = data.get("response") if isinstance(data, dict) else None
        if not isinstance(response, dict):
            return frame
        if data.get("type") in ("response.completed", "response.incomplete"):
            data["response"] = remember(response)
        else:
            response["previous_response_id"] = previous
        lines[i] = b"data: " + json.dumps(data).encode()
    return b"\n".join(lines)
