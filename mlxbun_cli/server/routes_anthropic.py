"""Anthropic wire routes: /v1/messages and /v1/messages/count_tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from mlxbun_cli.errors import MlxbunError, OptionError
from mlxbun_cli.prep.events import Done, OutputEvent
from mlxbun_cli.prep.pipeline import PreparedRequest
from mlxbun_cli.protocols import WireError
from mlxbun_cli.protocols import anthropic as wire
from mlxbun_cli.server.bridge import guard_stream, stream_events, unless_client_leaves
from mlxbun_cli.server.direct_write import EventStreamResponse
from mlxbun_cli.server.errors import error_response, register_error_shape
from mlxbun_cli.server.routes_openai import prepared_headers, read_json, stream_headers
from mlxbun_cli.server.state import ServerState

PREFIX = "/v1/messages"
SHUTDOWN_MESSAGE = "the request was cancelled (server shutting down)"

router = APIRouter()
register_error_shape(PREFIX, wire.error_body)


def _not_ready(state: ServerState) -> Response | None:
    if state.loaded is not None:
        return None
    if state.load_error:
        message = f"the model failed to load: {state.load_error}"
        return error_response(503, message, "engine_unavailable", path=PREFIX)
    return error_response(
        503,
        "the model is still loading — retry shortly",
        "engine_unavailable",
        headers={"Retry-After": "1"},
        path=PREFIX,
    )


def _prepare(state: ServerState, parsed: wire.MessagesRequest) -> PreparedRequest:
    try:
        return state.prepare(parsed.request)
    except MlxbunError as exc:  # in this wire's error shape, with this wire's field names
        field = exc.field if isinstance(exc, OptionError) else None
        message, ours = exc.message, wire.wire_field(field)
        if field and ours != field:
            message = message.replace(field, ours or field, 1)
        if exc.exit_code == 2:
            raise WireError(message, ours) from exc
        raise WireError(message, ours, 500, "api_error") from exc


@router.post(PREFIX, openapi_extra=wire.MESSAGES_BODY, summary="Create a message (Anthropic wire)")
async def messages(request: Request) -> Response:
    state: ServerState = request.app.state.mlxbun
    parsed = wire.parse_messages(await read_json(request))
    not_ready = _not_ready(state)
    if not_ready is not None:
        return not_ready
    state.counters.requests += 1
    prepared = _prepare(state, parsed)
    renderer = wire.MessageStream(wire.new_id("msg"), state.loaded.id, parsed.omit_thinking)
    events = stream_events(state, prepared)
    if parsed.stream:

        def count_error() -> None:
            state.counters.errors += 1

        prompt_tokens = len(prepared.engine_request.prompt_tokens)
        return EventStreamResponse(
            guard_stream(
                state,
                render_stream(events, renderer, prompt_tokens, count_error),
                _failure_frames,
            ),
            media_type="text/event-stream",
            headers=stream_headers(prepared),
        )
    done = None
    async for event in unless_client_leaves(request.receive, events):
        if isinstance(event, Done):
            done = event
        else:
            renderer.feed(event)
    if done is None or done.finish_reason == "error":
        state.counters.errors += 1
        message = (done.error if done else None) or "generation failed"
        return error_response(500, message, "api_error", path=PREFIX)
    if done.finish_reason == "cancelled":
        return error_response(503, SHUTDOWN_MESSAGE, "overloaded_error", path=PREFIX)
    return JSONResponse(
        renderer.message(done, done.stop_sequence), headers=prepared_headers(prepared)
    )


async def render_stream(
    events: AsyncIterator[OutputEvent],
    renderer: wire.MessageStream,
    prompt_tokens: int,
    on_error: Callable[[], None] = lambda: None,
) -> AsyncIterator[bytes]:
    """Neutral events → the SSE bytes of one Anthropic message stream."""
    for frame in renderer.start(prompt_tokens):
        yield wire.sse(frame)
    async for event in events:
        if not isinstance(event, Done):
            for frame in renderer.feed(event):
                yield wire.sse(frame)
            continue
        if event.finish_reason == "error":
            on_error()
            yield wire.sse(wire.error_event(event.error or "generation failed", "api_error"))
        elif event.finish_reason == "cancelled":
            yield wire.sse(wire.error_event(SHUTDOWN_MESSAGE, "overloaded_error"))
        else:
            for frame in renderer.finish(event, event.stop_sequence):
                yield wire.sse(frame)
        return
    on_error()
    yield wire.sse(wire.error_event("generation ended without a result", "api_error"))


def _failure_frames(message: str) -> bytes:
    return wire.sse(wire.error_event(message, "api_error"))


@router.post(
    f"{PREFIX}/count_tokens",
    openapi_extra=wire.COUNT_TOKENS_BODY,
    summary="Count a message's prompt tokens (Anthropic wire)",
)
async def count_tokens(request: Request) -> Response:
    state: ServerState = request.app.state.mlxbun
    parsed = wire.parse_messages(await read_json(request), count_only=True)
    not_ready = _not_ready(state)
    if not_ready is not None:
        return not_ready
    prepared = _prepare(state, parsed)
    return JSONResponse({"input_tokens": len(prepared.engine_request.prompt_tokens)})
