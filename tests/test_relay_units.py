"""The isolated parent's chunk relay: framing kept whole, Responses events patched."""

from __future__ import annotations

import json

import pytest

from mlxbun_cli.server.chunked import ChunkDecoder, chunk_payloads, frame_chunk
from mlxbun_cli.server.parent_responses import ResponseObjectRewriter

EVENTS = [b"data: one\n\n", b"data: two two\n\n", b"x" * 300]


def test_decoder_yields_whole_chunks_however_the_bytes_arrive():
    body = b"".join(frame_chunk(e) for e in EVENTS) + b"0\r\n\r\n"
    for step in (1, 2, 7, len(body)):
        decoder, out = ChunkDecoder(), b""
        for i in range(0, len(body), step):
            ready = decoder.feed(body[i : i + step])
            # Never half a chunk: whatever comes out is whole chunks.
            assert chunk_payloads(ready) is not None
            out += ready
        assert decoder.done
        assert chunk_payloads(out) == b"".join(EVENTS)
        assert out == body[: -len(b"0\r\n\r\n")]


def test_decoder_ignores_chunk_extensions_and_rejects_bad_framing():
    decoder = ChunkDecoder()
    assert chunk_payloads(decoder.feed(b"3;ext=1\r\nabc\r\n")) == b"abc"
    with pytest.raises(ValueError):
        ChunkDecoder().feed(b"zz\r\nabc\r\n")
    with pytest.raises(ValueError):
        ChunkDecoder().feed(b"3\r\nabcXY")


def _event(kind: str, response: dict) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (
        kind.encode(),
        json.dumps({"type": kind, "response": response}).encode(),
    )


def test_rewriter_passes_deltas_untouched_and_patches_the_response_object():
    stored = []

    def remember(response):
        stored.append(response)
        return {**response, "store": True}

    rewriter = ResponseObjectRewriter("resp_prev", remember)
    created = rewriter(frame_chunk(_event("response.created", {"id": "r1"})))
    assert json.loads(chunk_payloads(created).split(b"data: ")[1])["response"] == {
        "id": "r1",
        "previous_response_id": "resp_prev",
    }
    delta = frame_chunk(b'event: response.output_text.delta\ndata: {"delta": "hi"}\n\n')
    assert rewriter(delta) is delta  # the common case: not even copied
    done = _event("response.completed", {"id": "r1", "status": "completed"})
    # The finished event split across two chunks: held until whole.
    first = rewriter(frame_chunk(done[:20]))
    second = rewriter(frame_chunk(done[20:]))
    assert first == b""
    out = chunk_payloads(second) + rewriter.finish()
    assert out.endswith(b"\n\n")
    assert json.loads(out.split(b"data: ")[1])["response"]["store"] is True
    assert stored == [{"id": "r1", "status": "completed"}]


class _Upstream:
    """A worker response: wire chunks, then optionally a failure."""

    status_code = 200

    def __init__(self, chunks, fail=False):
        self._chunks, self._fail = chunks, fail
        self.closed = False

    async def raw_chunks(self):
        from mlxbun_cli.server.uds_http import UpstreamError

        for chunk in self._chunks:
            yield chunk
        if self._fail:
            raise UpstreamError("the worker closed the connection mid-response")

    def abort(self):
        self.closed = True

    async def aclose(self):
        self.closed = True


class _Lease:
    released = 0

    class worker:  # noqa: N801  (the shape RelayResponse reads)
        class ref:  # noqa: N801
            id = "m"

        state = "restarting"

    def release(self):
        self.released += 1


@pytest.mark.parametrize("fail", [False, True])
def test_relay_without_uvicorn_frames_payloads_through_asgi(fail):
    # Off uvicorn (here httpx's ASGI transport) the chunks' payloads go out
    # through ASGI; a worker that fails mid-stream still ends with an error frame.
    import asyncio

    import httpx

    from mlxbun_cli.server.proxy import RelayResponse

    upstream, lease = _Upstream([frame_chunk(e) for e in EVENTS[:2]], fail), _Lease()

    async def app(scope, receive, send):
        await RelayResponse(upstream, lease, "/v1/chat/completions", {})(scope, receive, send)

    async def go():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as c:
            return await c.post("/v1/chat/completions")

    body = asyncio.run(go()).content
    assert body.startswith(EVENTS[0] + EVENTS[1])
    assert (b"engine_unavailable" in body) is fail
    assert upstream.closed and lease.released == 1


def test_prefetched_stream_starts_at_once_and_closes_cleanly():
    import asyncio

    from mlxbun_cli.server.direct_write import _Prefetched

    async def scenario() -> tuple[list, list]:
        log: list[str] = []

        async def body(n: int):
            try:
                log.append("started")
                for i in range(n):
                    await asyncio.sleep(0)
                    yield i
            finally:
                log.append("closed")

        stream = _Prefetched(body(3))
        await asyncio.sleep(0.01)  # e.g. waiting for the parent's answer
        assert log == ["started"]  # the body ran meanwhile
        items = [i async for i in stream]
        await stream.aclose()
        # Closed before its first item was asked for: the body is cancelled and closed.
        early = _Prefetched(body(3))
        await asyncio.sleep(0)
        await early.aclose()
        return items, log

    items, log = asyncio.run(scenario())
    assert items == [0, 1, 2]
    assert log == ["started", "closed", "started", "closed"]


@pytest.mark.parametrize("worker_wrote_it", [True, False])
def test_after_a_handoff_the_parent_ends_or_relays_by_the_workers_note(worker_wrote_it):
    # The worker either wrote the stream (its body: the NOTE and frames the parent
    # must pass on itself) or relayed after all (its body: the events themselves).
    import asyncio

    from mlxbun_cli.server import handoff
    from mlxbun_cli.server.proxy import RelayResponse

    completed = b'event: response.completed\ndata: {"response": {"id": "r"}}\n\n'
    body = handoff.NOTE + completed if worker_wrote_it else b"".join(EVENTS)
    seen: list[bytes] = []

    class Rewriter:
        def __call__(self, wire: bytes) -> bytes:
            seen.append(chunk_payloads(wire))
            return wire

        def finish(self) -> bytes:
            return b""

    # Split at awkward places: the NOTE itself may arrive in pieces.
    pieces = [body[:5], body[5:30], body[30:]]
    relay = RelayResponse(_Upstream([frame_chunk(p) for p in pieces], False), _Lease(),
                          "/v1/responses", {}, rewriter=Rewriter())  # fmt: skip
    before = dict(handoff.stats)

    async def go() -> tuple[bytes | None, bytes]:
        frames, rest = await relay._handed_off(relay.upstream.raw_chunks())
        return frames, b"".join([chunk_payloads(c) async for c in rest])

    frames, rest = asyncio.run(go())
    if worker_wrote_it:
        assert frames == completed and seen == [completed]
        assert handoff.stats["given"] == before["given"] + 1
    else:
        assert frames is None and rest == body  # all of it, relayed
        assert handoff.stats["missed"] == before["missed"] + 1


def test_side_socket_passes_the_socket_or_a_refusal(tmp_path):
    import asyncio
    import socket

    from mlxbun_cli.server import handoff

    worker_socket = str(tmp_path / "w.sock")
    listener = handoff.listen(worker_socket)
    client, peer = socket.socketpair()

    async def scenario() -> tuple:
        handoff.start(asyncio.get_running_loop())
        receiver = handoff.receiver()
        given = receiver.expect("t1")
        assert handoff._send(handoff.side_path(worker_socket), "t1", peer.fileno())
        fd = await receiver.wait("t1", given)
        refused = receiver.expect("t2")
        handoff._send(handoff.side_path(worker_socket), "t2", None)
        none = await receiver.wait("t2", refused)
        # An answer for a token no one waits for: its socket is closed, not kept.
        handoff._send(handoff.side_path(worker_socket), "late", peer.fileno())
        await asyncio.sleep(0.05)
        return fd, none

    try:
        fd, none = asyncio.run(scenario())
        assert none is None and fd is not None
        with socket.socket(fileno=fd) as passed:  # the worker's own copy of the socket
            passed.sendall(b"hello")
        assert client.recv(5) == b"hello"
    finally:
        handoff.forget(worker_socket)
        handoff._receiver = None
        listener.close()
        client.close()
        peer.close()
