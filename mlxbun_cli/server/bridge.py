"""Running a prepared request on the scheduler from the event loop."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from mlxbun_cli.engine.types import Finished
from mlxbun_cli.prep.events import OutputEvent
from mlxbun_cli.prep.pipeline import OutputProcessor, PreparedRequest
from mlxbun_cli.server.disconnect import ClientGone, wait_for_disconnect
from mlxbun_cli.server.state import ServerState


class LoopInbox:
    """Events from the scheduler thread to one coroutine, with few loop wake-ups.

    The scheduler appends to a deque; the loop is woken (call_soon_threadsafe,
    a self-pipe write) only when the consumer is waiting and no wake-up is
    already on its way, so a step that yields several events costs one wake.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._waiter: asyncio.Future | None = None
        self._wake_pending = False

    def put(self, item: Any) -> None:  # any thread
        with self._lock:
            self._items.append(item)
            if self._waiter is None or self._wake_pending:
                return
            self._wake_pending = True
        self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
            waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def poke(self) -> None:
        """Wake the consumer without an item (e.g. shutdown started); loop thread only."""
        self._wake()

    def get_nowait(self) -> Any:
        with self._lock:
            return self._items.popleft() if self._items else _EMPTY

    async def wait(self, timeout: float | None = None) -> None:
        with self._lock:
            if self._items:
                return
            self._waiter = self._loop.create_future()
            waiter = self._waiter
        try:
            await asyncio.wait_for(waiter, timeout) if timeout is not None else await waiter
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                if self._waiter is waiter:
                    self._waiter = None


_EMPTY = object()


def stream_events(state: ServerState, prepared: PreparedRequest) -> AsyncIterator[OutputEvent]:
    """Neutral events for one request; leaving early (a client hang-up) cancels it.

    The request goes to the scheduler now, not at the first read: its prefill
    overlaps sending the response headers (and, in a worker, the handoff).
    """
    inbox = LoopInbox(asyncio.get_running_loop())
    handle = state.loaded.scheduler.submit(prepared.engine_request, inbox.put)
    return _Submitted(handle, _events(state, prepared, inbox, handle))


class _Submitted:
    """The events of a request already submitted; closing or dropping them cancels it."""

    def __init__(self, handle: Any, events: AsyncIterator[OutputEvent]) -> None:
        self._handle = handle
        self._events = events

    def __aiter__(self) -> _Submitted:
        return self

    def __anext__(self) -> Any:
        return self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            self._handle.cancel()  # a no-op once finished; never started: it stops now

    def __del__(self) -> None:
        self._handle.cancel()


async def _events(
    state: ServerState, prepared: PreparedRequest, inbox: LoopInbox, handle: Any
) -> AsyncIterator[OutputEvent]:
    loaded = state.loaded
    loop = asyncio.get_running_loop()
    processor = OutputProcessor(loaded, prepared)
    state.counters.streams_active += 1
    draining = state.draining
    drain_watch = asyncio.ensure_future(draining.wait())
    drain_watch.add_done_callback(lambda _: inbox.poke())
    deadline: float | None = None  # set once shutdown begins
    try:
        while True:
            if deadline is None and draining.is_set():
                deadline = loop.time() + state.options.shutdown_grace
            if deadline is not None and loop.time() >= deadline and not handle.cancelled.is_set():
                # The grace period is over: cancel; the engine answers with Finished.
                state.counters.shutdown_cancels += 1
                handle.cancel()
            event = inbox.get_nowait()
            if event is _EMPTY:
                timeout = None
                if deadline is not None and not handle.cancelled.is_set():
                    timeout = max(0.0, deadline - loop.time())
                await inbox.wait(timeout)
                continue
            if isinstance(event, Finished):
                for out in processor.on_finish(event):
                    yield out
                return
            for out in processor.on_step(event):
                yield out
            if processor.stop_requested:
                handle.cancel()
    finally:
        drain_watch.cancel()
        state.counters.streams_active -= 1
        state.counters.tool_parse_failures += processor.tool_parse_failures
        if not handle.cancelled.is_set():
            handle.cancel()  # no-op when finished; stops the sequence when the client left


async def unless_client_leaves(
    receive: Callable[[], Any], events: AsyncIterator[OutputEvent]
) -> AsyncIterator[OutputEvent]:
    """`events` for an answer sent whole; a hang-up stops the request at its next
    step (closing `events` cancels it) and raises ClientGone."""
    gone = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        while True:
            step = asyncio.ensure_future(events.__anext__())
            await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
                raise ClientGone
            try:
                event = step.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        gone.cancel()
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def guard_stream(
    state: ServerState, chunks: AsyncIterator[bytes], failure_frames: Callable[[str], bytes]
) -> AsyncIterator[bytes]:
    """A stream that fails after headers ends with the wire's error frame, never a silent cut."""
    completed = False
    try:
        async for chunk in chunks:
            yield chunk
        completed = True
    except Exception as exc:  # the headers are gone: say it in the stream
        state.counters.errors += 1
        yield failure_frames(f"generation failed: {exc}")
        completed = True
    finally:
        if not completed:
            state.counters.client_disconnects += 1
