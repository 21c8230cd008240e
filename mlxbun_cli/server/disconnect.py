"""Noticing a client that hung up while its whole (non-streamed) answer is made.

Streamed answers notice at their next write. An answer sent whole has nothing
to write until it is done, so these routes watch the ASGI receive channel,
which yields `http.disconnect` once the client has gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ClientGone(Exception):
    """The client hung up before a whole (non-streamed) answer was ready."""


async def wait_for_disconnect(receive: Callable[[], Any]) -> None:
    """Return once the client has gone (call after the request body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
