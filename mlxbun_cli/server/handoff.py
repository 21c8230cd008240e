"""Handing a client's connection to the worker that writes its event stream.

In isolated mode a relayed token crosses the parent: worker -> Unix socket ->
parent -> client, two more socket hops and two more process wake-ups per
token than `--in-process`. With a handoff the parent still reads the request,
leases the worker and writes the response headers (its middleware sees them),
then passes the client's socket to the worker (SCM_RIGHTS over a datagram
socket next to the worker's), and the worker writes the body's chunks straight
to the client. The worker's own response to the parent then carries only a
NOTE (below); when it ends, the parent ends the client's response, so uvicorn
keeps the connection's keep-alive as usual. The parent also keeps its other duties: the
lease lasts until the worker's response ends, a client that hangs up aborts
the worker's request, and a worker that dies mid-stream gets the wire's error
frame from the parent.

The protocol: the parent offers a handoff with a request header carrying a
fresh token; a worker that will take it answers with `accept` in the same
header, registers the token and waits (briefly) for one message on the side
socket: the token with the client socket, or the token alone (declined). A
worker that wrote the body itself ends its response to the parent with a
NOTE: that marker, then any frames the parent must see before the client
does (`ForParent`: the finished Responses object, which the parent stores
first). Any other body means the worker relayed after all (declined, or the
socket came too late or not at all), and the parent relays it as usual.

Known limit: a worker killed while a chunk to a slow client is half-written
leaves that chunk torn, and the error frame the parent then appends may not
parse; a client that has read its whole buffer never sees this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from typing import Any

from mlxbun_cli.server.chunked import frame_chunk

log = logging.getLogger("mlxbun.handoff")

PRIVATE_PREFIX = "x-mlxbun-"  # headers between the parent and its workers only
HEADER = "x-mlxbun-handoff"
# Responses: the history fields the parent keeps, for the worker to show (JSON).
SHOWN_HEADER = "x-mlxbun-shown"
ACCEPT = "accept"
WAIT_S = 1.0  # how long a worker waits for the parent's answer before relaying
MAX_TOKEN = 64
NOTE = b"mlxbun-handoff-note\n"  # never the start of an event stream's body

# given: streams the worker wrote; declined: offers the parent turned down;
# missed: offers the worker relayed after all (no socket in time)
stats = {"given": 0, "declined": 0, "missed": 0}


class ForParent(bytes):
    """A frame the parent must see (and pass on) itself, not the worker directly."""


def side_path(worker_socket: str) -> str:
    return worker_socket + ".fd"


# -- the parent's side -------------------------------------------------------------


def client_socket_fd(scope: dict, transport: Any) -> int | None:
    """The client connection's fd when the body may be written to it by another process."""
    if transport is None or scope.get("http_version") != "1.1":
        return None
    if transport.get_extra_info("sslcontext") is not None:
        return None  # TLS state lives in this process
    sock = transport.get_extra_info("socket")
    try:
        return sock.fileno() if sock is not None else None
    except (OSError, ValueError):
        return None


def _possible(scope: dict) -> bool:
    """Whether this request's response body could be written by a worker."""
    from mlxbun_cli.server.direct_write import SERVER_CYCLE, is_uvicorn_cycle

    cycle = scope.get(SERVER_CYCLE)
    return is_uvicorn_cycle(cycle) and client_socket_fd(scope, cycle.transport) is not None


class Offer:
    """One request's handoff offer; answered exactly once (given or declined)."""

    @classmethod
    def for_request(cls, scope: dict, worker_socket: str) -> Offer | None:
        """An offer, where this request's connection could be handed over; else None."""
        return cls(worker_socket) if _possible(scope) else None

    def __init__(self, worker_socket: str) -> None:
        self.token = secrets.token_hex(16)
        self.path = side_path(worker_socket)
        self.accepted = False
        self._answered = False

    def header(self) -> tuple[str, str]:
        return HEADER, self.token

    def give(self, scope: dict, transport: Any) -> bool:
        """Pass the client socket to the worker; False (and declined) where it cannot be."""
        if not self.accepted or self._answered:
            return False
        fd = client_socket_fd(scope, transport)
        # Bytes still queued in this process would land after the worker's.
        if fd is None or transport.get_write_buffer_size() or transport.is_closing():
            self.decline()
            return False
        self._answered = True
        # True: the socket went; the worker's NOTE will say whether it was used.
        return _send(self.path, self.token, fd)

    def decline(self) -> None:
        if self.accepted and not self._answered:
            self._answered = True
            stats["declined"] += 1
            _send(self.path, self.token, None)


_channels: dict[str, socket.socket] = {}


def _send(path: str, token: str, fd: int | None) -> bool:
    """One message on the worker's side socket; reconnects once (the worker restarted)."""
    for attempt in (0, 1):
        channel = _channels.get(path)
        try:
            if channel is None:
                channel = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                channel.setblocking(False)
                _channels[path] = channel
                channel.connect(path)
            socket.send_fds(channel, [token.encode()], [fd] if fd is not None else [])
            return True
        except OSError as exc:
            channel = _channels.pop(path, None)
            if channel is not None:
                channel.close()
            if attempt:
                log.debug("handoff to %s failed: %s", path, exc)
    return False


def forget(worker_socket: str) -> None:
    """Drop the side channel of a worker that is gone."""
    channel = _channels.pop(side_path(worker_socket), None)
    if channel is not None:
        channel.close()


# -- the worker's side ---------------------------------------------------------------


class Receiver:
    """The worker's side socket: resolves each waiting stream with its client socket."""

    def __init__(self, listener: socket.socket) -> None:
        self._listener = listener
        self._waiting: dict[str, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._listener.setblocking(False)
        loop.add_reader(self._listener.fileno(), self._read)

    def _read(self) -> None:
        while True:  # every datagram queued, one answer each
            try:
                message, fds, flags, _addr = socket.recv_fds(self._listener, MAX_TOKEN, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("handoff socket: %s", exc)
                return
            if flags & socket.MSG_CTRUNC:  # the socket did not arrive (out of fds): relay
                self._close(fds)
                fds = []
            waiter = self._waiting.pop(message.decode("ascii", "replace"), None)
            if waiter is None or waiter.done():  # too late, or not ours: not ours to keep
                self._close(fds)
                continue
            waiter.set_result(fds[0] if fds else None)

    @staticmethod
    def _close(fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                socket.close(fd)

    def expect(self, token: str) -> asyncio.Future:
        """Register before answering `accept`, so the parent's message cannot come first."""
        waiter = self._loop.create_future()
        self._waiting[token] = waiter
        return waiter

    async def wait(self, token: str, waiter: asyncio.Future) -> int | None:
        """The client socket's fd, or None: declined, or no answer in time."""
        try:
            return await asyncio.wait_for(waiter, WAIT_S)
        except asyncio.TimeoutError:
            log.warning("no handoff answer from the parent in %.0f s; relaying", WAIT_S)
            return None
        finally:
            self.forget(token)

    def forget(self, token: str) -> None:
        self._waiting.pop(token, None)


_receiver: Receiver | None = None


def listen(worker_socket: str) -> socket.socket:
    """Bind the side socket next to the worker's (before the parent may connect)."""
    global _receiver
    path = side_path(worker_socket)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # macOS has no SEQPACKET
    listener.bind(path)
    _receiver = Receiver(listener)
    return listener


def start(loop: asyncio.AbstractEventLoop) -> None:
    """Start taking handoffs on this worker's event loop (no-op outside a worker)."""
    if _receiver is not None:
        _receiver.start(loop)


def receiver() -> Receiver | None:
    """This worker's receiver, once its event loop runs; None in any other process."""
    r = _receiver
    return r if r is not None and r._loop is not None else None


def offered_token(scope: dict) -> str | None:
    """The parent's handoff token on this request, if any."""
    name = HEADER.encode()
    for key, value in scope.get("headers", ()):
        if key == name:
            token = value.decode("ascii", "replace")
            return token if 0 < len(token) <= MAX_TOKEN else None
    return None


async def write_stream(fd: int, chunks: Any) -> bytes:
    """Write each chunk, chunk-framed, to the client socket; then the NOTE for the parent.

    `ForParent` chunks are kept for the NOTE instead. A client that left ends
    the writing (the caller closes `chunks`, which cancels the request).
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(fileno=fd)  # this process's copy; closing it leaves the parent's
    sock.setblocking(False)
    for_parent: list[bytes] = []
    try:
        async for chunk in chunks:
            if isinstance(chunk, str):
                chunk = chunk.encode()
            if isinstance(chunk, ForParent):
                for_parent.append(bytes(chunk))
                continue
            if not chunk:
                continue
            data = frame_chunk(chunk)
            try:
                try:
                    sent = sock.send(data)
                except BlockingIOError:
                    sent = 0
                if sent < len(data):
                    await loop.sock_sendall(sock, data[sent:])  # a slow client: wait for room
            except OSError:  # EPIPE/ECONNRESET: the client left
                return NOTE
        return NOTE + b"".join(for_parent)
    finally:
        sock.close()
