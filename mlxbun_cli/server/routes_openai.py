"""OpenAI wire routes: chat/completions, completions, models."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from mlxbun_cli.catalog import known_models
from mlxbun_cli.client.results import Collected
from mlxbun_cli.prep.events import Done, ReasoningDelta, TextDelta, TokenLogprob, ToolCallEvent
from mlxbun_cli.protocols import JSON_ERRORS, WireError
from mlxbun_cli.protocols import openai as wire
from mlxbun_cli.server.bridge import guard_stream, stream_events, unless_client_leaves
from mlxbun_cli.server.direct_write import EventStreamResponse
from mlxbun_cli.server.errors import error_response
from mlxbun_cli.server.schemas import CHAT_BODY, COMPLETION_BODY
from mlxbun_cli.server.state import ServerState

router = APIRouter()


async def read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except JSON_ERRORS as exc:
        raise WireError(f"the body is not valid JSON: {exc}") from exc


def sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def ready_or_error(state: ServerState) -> JSONResponse | None:
    if state.loaded is not None:
        return None
    if state.load_error:
        return error_response(
            503, f"the model failed to load: {state.load_error}", "engine_unavailable"
        )
    return error_response(
        503,
        "the model is still loading — retry shortly",
        "engine_unavailable",
        headers={"Retry-After": "1"},
    )


def stream_headers(prepared: Any) -> dict[str, str]:
    """Headers of an event stream: no caching or proxy buffering, plus the request's own."""
    return {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **prepared_headers(prepared)}


def _header_text(text: str) -> str:
    """Text a quoted header value can hold: no quotes, backslashes or control characters
    (a warning may quote the user's own schema)."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", text.replace("\\", "").replace('"', "'"))


def prepared_headers(prepared: Any) -> dict[str, str]:
    """Warning and clamp headers a prepared request earned, for every wire."""
    headers = {}
    if prepared.warnings:
        # RFC 7234 warn-code 299 ("miscellaneous persistent warning"); quotes escaped.
        headers["Warning"] = (
            ", ".join('299 mlxbun "' + _header_text(w) + '"' for w in prepared.warnings)
            .encode("ascii", "replace")
            .decode("ascii")
        )
    if prepared.max_tokens_clamped_from:
        headers["X-Max-Tokens-Clamped"] = (
            f"{prepared.max_tokens_clamped_from}->{prepared.engine_request.max_tokens}"
        )
    return headers


async def _generate(
    request: Request, parse: Callable, render_full: Callable, render_stream: Callable
) -> Response:
    state: ServerState = request.app.state.mlxbun
    body = await read_json(request)
    model, req, stream, include_usage = parse(body)
    not_ready = ready_or_error(state)
    if not_ready is not None:
        return not_ready
    state.counters.requests += 1
    prepared = state.prepare(req)
    model_id = state.loaded.id
    events = stream_events(state, prepared)
    if stream:
        return EventStreamResponse(
            guard_stream(state, render_stream(events, model_id, include_usage), _failure_frames),
            media_type="text/event-stream",
            headers=stream_headers(prepared),
        )
    collected, logprobs = Collected(), []
    async for event in unless_client_leaves(request.receive, events):
        collected.add(event)
        if isinstance(event, TokenLogprob):
            logprobs.append(event)
    done = collected.done
    if done is None or done.finish_reason == "error":
        state.counters.errors += 1
        return error_response(
            500, (done.error if done else None) or "generation failed", "server_error"
        )
    return JSONResponse(
        render_full(model_id, collected, logprobs if req.logprobs else None),
        headers=prepared_headers(prepared),
    )


def _failure_frames(message: str) -> bytes:
    return sse(wire.error_body(message, "server_error")) + b"data: [DONE]\n\n"


def _end_frames(done: Done) -> list[bytes] | None:
    if done.finish_reason == "error":
        return [
            sse(wire.error_body(done.error or "generation failed", "server_error")),
            b"data: [DONE]\n\n",
        ]
    if done.finish_reason == "cancelled":
        return [
            sse(
                wire.error_body(
                    "the request was cancelled (server shutting down)", "server_shutdown"
                )
            ),
            b"data: [DONE]\n\n",
        ]
    return None


def _content_chunk_prefix(rid: str, model: str, created: int) -> bytes:
    """The bytes before a content delta's text: encoded once per stream, not per token."""
    head = json.dumps(wire.chat_chunk(rid, model, created, {"content": ""}), ensure_ascii=False)
    marker = '"content": ""'
    return ("data: " + head[: head.index(marker) + len('"content": ')]).encode()


_CONTENT_SUFFIX = b'}, "finish_reason": null}]}\n\n'


async def _chat_stream(
    events: AsyncIterator[Any], model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    rid, created = wire.new_id("chatcmpl"), int(time.time())
    prefix = _content_chunk_prefix(rid, model, created)
    yield sse(wire.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
    pending_logprobs: list[TokenLogprob] = []
    async for event in events:
        if isinstance(event, TokenLogprob):
            pending_logprobs.append(event)
        elif isinstance(event, TextDelta):
            if pending_logprobs:
                yield sse(
                    wire.chat_chunk(
                        rid, model, created, {"content": event.text}, logprobs=pending_logprobs
                    )
                )
                pending_logprobs = []
            else:  # the hot path: one json.dumps of the text, not of the whole chunk
                yield prefix + json.dumps(event.text, ensure_ascii=False).encode() + _CONTENT_SUFFIX
        elif isinstance(event, ReasoningDelta):
            yield sse(wire.chat_chunk(rid, model, created, {"reasoning_content": event.text}))
        elif isinstance(event, ToolCallEvent):
            call = event.call.as_openai()
            yield sse(
                wire.chat_chunk(
                    rid, model, created, {"tool_calls": [{"index": event.index, **call}]}
                )
            )
        elif isinstance(event, Done):
            end = _end_frames(event)
            if end:
                for frame in end:
                    yield frame
                return
            yield sse(
                wire.chat_chunk(
                    rid,
                    model,
                    created,
                    {},
                    wire.finish_reason(event),
                    logprobs=pending_logprobs or None,
                )
            )
            if include_usage:
                yield sse(wire.usage_chunk(rid, model, created, event))
    yield b"data: [DONE]\n\n"


async def _completion_stream(
    events: AsyncIterator[Any], model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    rid, created = wire.new_id("cmpl"), int(time.time())
    pending: list[TokenLogprob] = []
    async for event in events:
        if isinstance(event, TokenLogprob):
            pending.append(event)
        elif isinstance(event, (TextDelta, ReasoningDelta)):
            yield sse(
                wire.completion_chunk(rid, model, created, event.text, logprobs=pending or None)
            )
            pending = []
        elif isinstance(event, Done):
            end = _end_frames(event)
            if end:
                for frame in end:
                    yield frame
                return
            yield sse(
                wire.completion_chunk(
                    rid, model, created, "", wire.finish_reason(event), pending or None
                )
            )
            if include_usage:
                chunk = wire.usage_chunk(rid, model, created, event)
                chunk["object"] = "text_completion"
                yield sse(chunk)
    yield b"data: [DONE]\n\n"


def _chat_full(model: str, c: Collected, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
    return wire.chat_response(
        wire.new_id("chatcmpl"), model, c.text, c.reasoning, c.tool_calls, logprobs, c.done
    )


def _completion_full(
    model: str, c: Collected, logprobs: list[TokenLogprob] | None
) -> dict[str, Any]:
    return wire.completion_response(
        wire.new_id("cmpl"), model, c.reasoning + c.text, logprobs, c.done
    )


@router.post(
    "/v1/chat/completions", openapi_extra=CHAT_BODY, summary="Chat completion (OpenAI wire)"
)
async def chat_completions(request: Request) -> Response:
    return await _generate(request, wire.parse_chat, _chat_full, _chat_stream)


@router.post(
    "/v1/completions", openapi_extra=COMPLETION_BODY, summary="Text completion (OpenAI wire)"
)
async def completions(request: Request) -> Response:
    return await _generate(request, wire.parse_completion, _completion_full, _completion_stream)


def _model_entry(model_id: str, state: ServerState, created: int) -> dict[str, Any]:
    resident = state.loaded is not None and state.loaded.id == model_id
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "local",
        "resident": resident,
        "current": model_id == state.ref.id,
    }


@router.get("/v1/models", summary="List local models")
async def list_models(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.mlxbun
    created = int(state.started_at)
    ids = [state.ref.id] + [r.id for r in known_models() if r.id != state.ref.id]
    return {"object": "list", "data": [_model_entry(i, state, created) for i in ids]}


@router.get("/v1/models/{model_id:path}", summary="One local model")
async def get_model(model_id: str, request: Request) -> Response:
    state: ServerState = request.app.state.mlxbun
    ids = {state.ref.id} | {r.id for r in known_models()}
    if model_id not in ids:
        return error_response(404, f"no local model '{model_id}'", "not_found_error", "model")
    return JSONResponse(_model_entry(model_id, state, int(state.started_at)))
