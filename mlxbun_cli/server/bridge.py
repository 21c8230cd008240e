"""Running a prepared request on the scheduler from the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from mlxbun_cli.engine.types import Finished
from mlxbun_cli.prep.events import OutputEvent
from mlxbun_cli.prep.pipeline import OutputProcessor, PreparedRequest
from mlxbun_cli.server.state import ServerState


async def stream_events(
    state: ServerState, prepared: PreparedRequest
) -> AsyncIterator[OutputEvent]:
    """Neutral events for one request; leaving early (a client hang-up) cancels it."""
    loaded = state.loaded
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    handle = loaded.scheduler.submit(
        prepared.engine_request, lambda event: loop.call_soon_threadsafe(inbox.put_nowait, event)
    )
    processor = OutputProcessor(loaded, prepared)
    state.counters.streams_active += 1
    drain = asyncio.ensure_future(state.draining.wait())
    deadline: float | None = None  # set once shutdown begins
    try:
        while True:
            if deadline is None and drain.done():
                deadline = loop.time() + state.options.shutdown_grace
            if deadline is not None and loop.time() >= deadline and not handle.cancelled.is_set():
                # The grace period is over: cancel; the engine answers with Finished.
                state.counters.shutdown_cancels += 1
                handle.cancel()
            try:
                event = inbox.get_nowait()  # the common case: no task, no wait
            except asyncio.QueueEmpty:
                get = asyncio.ensure_future(inbox.get())
                waiting = {get} if deadline is not None else {get, drain}
                timeout = None
                if deadline is not None and not handle.cancelled.is_set():
                    timeout = max(0.0, deadline - loop.time())
                done, _ = await asyncio.wait(
                    waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if get not in done:
                    get.cancel()
                    continue
                event = get.result()
            if isinstance(event, Finished):
                for out in processor.on_finish(event):
                    yield out
                return
            for out in processor.on_step(event):
                yield out
            if processor.stop_requested:
                handle.cancel()
    finally:
        drain.cancel()
        state.counters.streams_active -= 1
        state.counters.tool_parse_failures += processor.tool_parse_failures
        if not handle.cancelled.is_set():
            handle.cancel()  # no-op when finished; stops the sequence when the client left
