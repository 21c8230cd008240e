"""Writing streamed bodies straight to uvicorn's connection.

Each ASGI `send` of a token's chunk passes through every middleware's send
wrapper before uvicorn frames it; at a few hundred tokens a second that is a
good part of the event loop's work. uvicorn's `send` is a method of its
per-request cycle, which holds the client transport: when the app is served
by uvicorn and the response is chunked, the body can be framed and written
directly. Headers and the end of the body still go through ASGI, so
middleware sees the response start and uvicorn finishes the response (and
the connection's keep-alive) itself. Anything else takes the ordinary path.

In an isolated worker the parent may hand over the client's connection itself
(server/handoff.py); the body is then written to that socket instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.responses import StreamingResponse

from mlxbun_cli.server import handoff
from mlxbun_cli.server.chunked import frame_chunk

SERVER_CYCLE = "mlxbun.server_cycle"
WRITE_BUFFER_HIGH = 1 << 20  # bytes queued for a slow client before the stream waits


def capture_server_cycle(app: Any) -> Any:
    """Wrap the ASGI app so responses can reach uvicorn's cycle for their request."""

    async def with_cycle(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope[SERVER_CYCLE] = getattr(send, "__self__", None)
        await app(scope, receive, send)

    return with_cycle


def is_uvicorn_cycle(cycle: Any) -> bool:
    return all(
        hasattr(cycle, name)
        for name in ("transport", "chunked_encoding", "response_started", "disconnected")
    )


def chunked_transport(scope: dict) -> Any:
    """The client transport, once this response is uvicorn's and chunk-framed; else None."""
    cycle = scope.get(SERVER_CYCLE)
    if not is_uvicorn_cycle(cycle):
        return None
    return cycle.transport if cycle.chunked_encoding is True else None


async def wait_writable(transport: Any) -> bool:
    """Back-pressure from a slow client; False once the client is gone."""
    while transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
        if transport.is_closing():
            return False
        await asyncio.sleep(0.005)
    return not transport.is_closing()


class EventStreamResponse(StreamingResponse):
    """A StreamingResponse whose chunks go straight to the client connection."""

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self._scope = scope
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Any) -> None:
        headers = self.raw_headers
        receiver = handoff.receiver()
        token = handoff.offered_token(self._scope) if receiver is not None else None
        if token is not None:  # in a worker, offered the client's connection by the parent
            waiter = receiver.expect(token)
            headers = [*headers, (handoff.HEADER.encode(), handoff.ACCEPT.encode())]
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": headers}
            )
            if token is not None:
                # The generation starts while the parent answers, not after.
                self.body_iterator = _Prefetched(self.body_iterator)
                fd = await receiver.wait(token, waiter)
                if fd is not None:
                    note = await handoff.write_stream(fd, self.body_iterator)
                    await send({"type": "http.response.body", "body": note, "more_body": False})
                    return
            transport = chunked_transport(self._scope)
            if transport is None:
                async for chunk in self.body_iterator:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                async for chunk in self.body_iterator:
                    if not await wait_writable(transport):
                        return  # the client left; closing the iterator cancels the request
                    if isinstance(chunk, str):
                        chunk = chunk.encode()
                    if chunk:
                        transport.write(frame_chunk(chunk))
        finally:
            if token is not None:
                receiver.forget(token)
            await self._close_body()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _close_body(self) -> None:
        aclose = getattr(self.body_iterator, "aclose", None)
        if aclose is not None:
            await aclose()


_END = object()


class _Prefetched:
    """An async iterator whose first item is already being fetched, in a task."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._first: asyncio.Future | None = asyncio.ensure_future(self._fetch())

    async def _fetch(self) -> Any:
        try:
            return await self._iterator.__anext__()
        except StopAsyncIteration:
            return _END

    def __aiter__(self) -> _Prefetched:
        return self

    async def __anext__(self) -> Any:
        if self._first is None:
            return await self._iterator.__anext__()
        first, self._first = self._first, None
        item = await first
        if item is _END:
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        first, self._first = self._first, None
        if first is not None and not first.done():
            first.cancel()  # the request is cancelled inside, as a hang-up would
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await first
        elif first is not None and not first.cancelled():
            first.exception()  # retrieved: a failure no one read is not logged as lost
        aclose = getattr(self._iterator, "aclose", None)
        if aclose is not None:
            await aclose()
