"""A small HTTP/1.1 client over a worker's Unix socket, for the proxy's hot path.

h11 keeps the protocol honest; asyncio streams keep the socket registered with
the event loop for the whole response, which makes relaying a token stream
much cheaper than a general-purpose client that re-arms the socket per read.
One connection per request (`Connection: close`): a hang-up closes it, and the
worker sees the disconnect at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import h11

from mlxbun_cli.server.chunked import ChunkDecoder

READ_SIZE = 65536


class UpstreamError(Exception):
    """The worker could not be reached, or stopped mid-response."""


class Headers:
    def __init__(self, pairs: Iterable[tuple[bytes, bytes]]) -> None:
        self._pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in pairs]

    def get(self, name: str, default: str = "") -> str:
        name = name.lower()
        for key, value in self._pairs:
            if key.lower() == name:
                return value
        return default

    def items(self) -> list[tuple[str, str]]:
        return list(self._pairs)


class UpstreamResponse:
    def __init__(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        response: h11.Response,
    ) -> None:
        self._conn = conn
        self._reader = reader
        self._writer = writer
        self.status_code = response.status_code
        self.headers = Headers(response.headers)

    async def _next_event(self) -> object:
        while True:
            event = self._conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self._reader.read(READ_SIZE)
            except OSError as exc:
                raise UpstreamError(f"worker connection failed: {exc}") from exc
            if not data and self._conn.their_state is not h11.DONE:
                raise UpstreamError("the worker closed the connection mid-response")
            self._conn.receive_data(data)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        while True:
            try:
                event = await self._next_event()
            except h11.RemoteProtocolError as exc:
                raise UpstreamError(f"the worker broke HTTP: {exc}") from exc
            if isinstance(event, h11.Data):
                # Whatever else already arrived goes out in the same write.
                chunks, ended = [bytes(event.data)], False
                while True:
                    try:
                        more = self._conn.next_event()
                    except h11.RemoteProtocolError as exc:
                        raise UpstreamError(f"the worker broke HTTP: {exc}") from exc
                    if isinstance(more, h11.Data):
                        chunks.append(bytes(more.data))
                        continue
                    ended = isinstance(more, (h11.EndOfMessage, h11.ConnectionClosed))
                    break
                yield b"".join(chunks)
                if ended:
                    return
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return

    @property
    def is_chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding").lower()

    async def raw_chunks(self) -> AsyncIterator[bytes]:
        """The body as whole HTTP/1.1 chunks in wire format, framing included.

        For relaying to a client whose response is chunked too: no parsing of
        payloads and no re-framing, and since only complete chunks come out,
        the relay can always append a chunk of its own (an error frame) after
        a failure. The final zero-size chunk is not included.
        """
        decoder = ChunkDecoder()
        data, _closed = self._conn.trailing_data  # what h11 read past the headers
        while True:
            if data:
                try:
                    ready = decoder.feed(bytes(data))
                except ValueError as exc:
                    raise UpstreamError(f"the worker broke HTTP: {exc}") from exc
                if ready:
                    yield ready
                if decoder.done:
                    return
            try:
                data = await self._reader.read(READ_SIZE)
            except OSError as exc:
                raise UpstreamError(f"worker connection failed: {exc}") from exc
            if not data:
                raise UpstreamError("the worker closed the connection mid-response")

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    def abort(self) -> None:
        """Drop the connection now: a pending read ends, and the worker sees the hang-up."""
        self._writer.transport.abort()

    async def aclose(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass


async def send(
    socket_path: str, method: str, target: str, headers: list[tuple[str, str]], body: bytes
) -> UpstreamResponse:
    """Send one request; returns once the response's status and headers arrived."""
    try:
        reader, writer = await asyncio.open_unix_connection(socket_path, limit=READ_SIZE * 4)
    except OSError as exc:
        raise UpstreamError(f"cannot connect to the worker: {exc.strerror or exc}") from exc
    conn = h11.Connection(h11.CLIENT)
    skip = {"host", "content-length", "connection", "transfer-encoding"}
    request_headers = [
        ("host", "mlxbun-worker"),
        ("content-length", str(len(body))),
        ("connection", "close"),
    ]
    request_headers += [(k, v) for k, v in headers if k.lower() not in skip]
    try:
        # One write, so the worker wakes once for the whole request.
        wire = [conn.send(h11.Request(method=method, target=target, headers=request_headers))]
        if body:
            wire.append(conn.send(h11.Data(data=body)))
        wire.append(conn.send(h11.EndOfMessage()))
        writer.write(b"".join(wire))
        await writer.drain()
        response = UpstreamResponse(conn, reader, writer, h11.Response(status_code=200, headers=[]))
        while True:
            event = await response._next_event()
            if isinstance(event, h11.Response):
                return UpstreamResponse(conn, reader, writer, event)
            if isinstance(event, h11.ConnectionClosed):
                raise UpstreamError("the worker closed the connection before answering")
    except (OSError, h11.ProtocolError) as exc:
        writer.close()
        raise UpstreamError(f"the worker failed the request: {exc}") from exc
    except (UpstreamError, asyncio.CancelledError):
        writer.close()  # cancelled: the client left, and the worker sees it go
        raise
