"""HTTP/1.1 chunked transfer coding: framing chunks, and finding whole ones as bytes arrive.

Shared by the worker (which frames its event streams for the client), and the
isolated parent (which relays or reads a worker's chunked body). No HTTP
library: these run per token.
"""

from __future__ import annotations


def _chunk_size(line: bytes) -> int:
    """The size in a chunk's size line (hex, extensions ignored); ValueError if bad."""
    return int(line.split(b";", 1)[0], 16)


class ChunkDecoder:
    """Finds whole chunks in a chunked body as bytes arrive."""

    def __init__(self) -> None:
        self._pending = b""
        self.done = False

    def feed(self, data: bytes) -> bytes:
        """Every chunk completed by `data`, in wire format; ValueError on bad framing."""
        if self.done:  # the trailer section after the last chunk is not relayed
            return b""
        buf = self._pending + data if self._pending else data
        pos, size_of_buf = 0, len(buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = _chunk_size(buf[pos:eol])
            if size == 0:  # the last chunk; trailers, if any, are not relayed
                self.done = True
                self._pending = b""
                return buf[:pos]
            end = eol + 2 + size + 2
            if end > size_of_buf:
                break
            if buf[end - 2 : end] != b"\r\n":
                raise ValueError("chunk not terminated by CRLF")
            pos = end
        self._pending = buf[pos:]
        return buf[:pos]


def chunk_payloads(wire: bytes) -> bytes:
    """The payload bytes of whole chunks in wire format (as ChunkDecoder gives them)."""
    parts, pos = [], 0
    while pos < len(wire):
        eol = wire.index(b"\r\n", pos)
        size = _chunk_size(wire[pos:eol])
        parts.append(wire[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2
    return b"".join(parts)


def frame_chunk(payload: bytes) -> bytes:
    """One chunk in wire format (empty for no payload: a zero-size chunk ends the body)."""
    return b"%x\r\n%s\r\n" % (len(payload), payload) if payload else b""
