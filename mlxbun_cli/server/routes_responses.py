"""OpenAI Responses wire routes: create (plain or streamed), retrieve, delete.

Validation order (mlx-bun's responses-client.ts): the body must be JSON and an
object, `input` a string or a list and `previous_response_id` a well-formed id
— all 400s — before the previous response is looked up, so only a missing or
expired previous response is a 404; the rest of the body is checked after.
A resumed request replays the stored conversation (its input items, then its
output items) before the new input; `instructions` are not carried over.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep.events import Done
from mlxbun_cli.protocols import WireError
from mlxbun_cli.protocols import responses as wire
from mlxbun_cli.protocols.openai import error_body
from mlxbun_cli.server import handoff
from mlxbun_cli.server.bridge import stream_events, unless_client_leaves
from mlxbun_cli.server.direct_write import EventStreamResponse
from mlxbun_cli.server.errors import error_response, register_error_shape
from mlxbun_cli.server.routes_openai import (
    prepared_headers,
    read_json,
    ready_or_error,
    stream_headers,
)
from mlxbun_cli.server.state import ServerState

router = APIRouter()

# The Responses wire answers errors in OpenAI's shape (the default, said out loud).
register_error_shape("/v1/responses", error_body)

_CANCELLED = "the request was cancelled (server shutting down)"

_CONTENT = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"type": "string", "enum": ["input_text", "output_text"]},
                    "text": {"type": "string"},
                },
            },
        },
    ]
}

_ITEM = {
    "oneOf": [
        {
            "type": "object",
            "title": "message",
            "required": ["role", "content"],
            "properties": {
                "type": {"type": "string", "enum": ["message"]},
                "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
                "content": _CONTENT,
            },
        },
        {
            "type": "object",
            "title": "function_call",
            "required": ["type", "call_id", "name", "arguments"],
            "properties": {
                "type": {"type": "string", "enum": ["function_call"]},
                "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"type": "string"},
            },
        },
        {
            "type": "object",
            "title": "function_call_output",
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"type": "string", "enum": ["function_call_output"]},
                "call_id": {"type": "string"},
                "output": _CONTENT,
            },
        },
        {
            "type": "object",
            "title": "reasoning",
            "required": ["type"],
            "properties": {
                "type": {"type": "string", "enum": ["reasoning"]},
                "summary": {"type": "array", "items": {"type": "object"}},
                "content": {"type": "array", "items": {"type": "object"}},
            },
        },
    ]
}

RESPONSES_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["input"],
                    "properties": {
                        "model": {"type": "string"},
                        "input": {
                            "oneOf": [
                                {"type": "string"},
                                {"type": "array", "minItems": 1, "items": _ITEM},
                            ]
                        },
                        "instructions": {"type": "string"},
                        "previous_response_id": {"type": "string", "pattern": "^resp_"},
                        "store": {"type": "boolean", "default": True},
                        "stream": {"type": "boolean"},
                        "max_output_tokens": {"type": "integer", "minimum": 1},
                        "temperature": {"type": "number", "minimum": 0},
                        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                        "reasoning": {
                            "type": "object",
                            "properties": {
                                "effort": {
                                    "type": "string",
                                    "enum": ["none", "minimal", "low", "medium", "high", "xhigh"],
                                }
                            },
                        },
                        "text": {
                            "type": "object",
                            "properties": {
                                "format": {
                                    "type": "object",
                                    "properties": {"type": {"type": "string", "enum": ["text"]}},
                                }
                            },
                        },
                        "tools": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["type", "name"],
                                "properties": {
                                    "type": {"type": "string", "enum": ["function"]},
                                    "name": {"type": "string"},
                                    "description": {"type": "string"},
                                    "parameters": {"type": "object"},
                                    "strict": {"type": "boolean"},
                                },
                            },
                        },
                        "tool_choice": {
                            "oneOf": [
                                {"type": "string", "enum": ["none", "auto", "required"]},
                                {
                                    "type": "object",
                                    "required": ["type", "name"],
                                    "properties": {
                                        "type": {"type": "string", "enum": ["function"]},
                                        "name": {"type": "string"},
                                    },
                                },
                            ]
                        },
                        "parallel_tool_calls": {"type": "boolean"},
                        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
                        "include": {"type": "array", "items": {"type": "string"}},
                        "metadata": {"type": "object"},
                        "prompt_cache_key": {"type": "string"},
                        "truncation": {"type": "string", "enum": ["disabled", "auto"]},
                        # mlxbun extensions: the chat wire's sampling knobs
                        "top_k": {"type": "integer", "minimum": 0},
                        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
                        "seed": {"type": "integer"},
                        "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
                        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
                        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
                        "logit_bias": {
                            "type": "object",
                            "additionalProperties": {"type": "number"},
                        },
                    },
                }
            }
        },
    }
}


def _not_found(rid: str, param: str | None = None, code: str | None = None) -> WireError:
    return WireError(
        f"no stored response with id {rid!r} (it was not stored, was deleted, or has expired)",
        param,
        status=404,
        type="invalid_request_error",
        code=code,
    )


def _prepare(state: ServerState, parsed: wire.ResponsesRequest, messages: list) -> Any:
    try:
        return state.prepare(replace(parsed.generation, messages=messages))
    except OptionError as exc:
        param = wire.wire_param(exc.field)
        detail = exc.message.removeprefix(f"{exc.field}: ")
        raise WireError(f"{param}: {detail}", param) from exc


def _reasoning_tokens(state: ServerState, text: str) -> int:
    """How many output tokens were thinking (the text re-encoded: the engine does not say)."""
    if not text:
        return 0
    try:
        return len(state.loaded.tokenizer.encode(text))
    except Exception:
        return 0


def _outcome(done: Done) -> tuple[str, str | None]:
    if done.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


class _Run:
    """One create request after validation: what its response object needs."""

    def __init__(
        self,
        state: ServerState,
        parsed: wire.ResponsesRequest,
        conversation: list[dict[str, Any]],
    ) -> None:
        self.state = state
        self.parsed = parsed
        self.conversation = conversation  # the input items the record keeps
        self.rid = wire.new_id("resp")
        self.created_at = int(time.time())
        self.model = state.loaded.id
        self.builder = wire.OutputBuilder()
        self.shown: dict[str, Any] = {}  # history fields the isolated parent keeps

    def snapshot(self, status: str) -> dict[str, Any]:
        response = wire.response_object(
            self.rid, self.model, self.created_at, self.parsed, status=status, output=[]
        )
        return {**response, **self.shown}

    def final(self, done: Done) -> dict[str, Any]:
        status, reason = _outcome(done)
        response = wire.response_object(
            self.rid,
            self.model,
            self.created_at,
            self.parsed,
            status=status,
            output=self.builder.output,
            usage=wire.usage_dict(done, _reasoning_tokens(self.state, self.builder.reasoning)),
            incomplete_reason=reason,
        )
        if self.parsed.store:
            self.state.responses.put(response, self.conversation)
        return {**response, **self.shown}


def _frame(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, ensure_ascii=False)
    return f"event: {payload['type']}\ndata: {data}\n\n".encode()


async def _stream(run: _Run, events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """The event stream; a failure after the headers ends with an `error` event."""
    state, builder, sequence = run.state, run.builder, 0
    completed = False

    def frame(payload: dict[str, Any]) -> bytes:
        nonlocal sequence
        payload["sequence_number"] = sequence
        sequence += 1
        return _frame(payload)

    try:
        yield frame({"type": "response.created", "response": run.snapshot("in_progress")})
        yield frame({"type": "response.in_progress", "response": run.snapshot("in_progress")})
        async for event in events:
            for payload in builder.feed(event):
                yield frame(payload)
        done = builder.done
        if done is None or done.finish_reason == "error":
            state.counters.errors += 1
            message = (done.error if done else None) or "generation failed"
            yield frame(wire.error_event(message, "server_error"))
        elif done.finish_reason == "cancelled":
            yield frame(wire.error_event(_CANCELLED, "engine_unavailable"))
        else:
            status, _ = _outcome(done)
            for payload in builder.finish(status):
                yield frame(payload)
            response = run.final(done)
            # An isolated parent stores it before the client can see it (handoff.py).
            yield handoff.ForParent(frame({"type": f"response.{status}", "response": response}))
        completed = True
    except Exception as exc:  # the headers are gone: say it in the stream
        state.counters.errors += 1
        yield frame(wire.error_event(f"generation failed: {exc}", "server_error"))
        completed = True
    finally:
        if not completed:
            state.counters.client_disconnects += 1
        await events.aclose()  # a client that left: its sequence stops now, not at GC


def _shown_by_parent(request: Request) -> dict[str, Any]:
    """In a worker: the history fields its parent keeps and wants shown as they are."""
    raw = request.headers.get(handoff.SHOWN_HEADER)
    if raw is None or handoff.receiver() is None:  # only a parent talks to a worker
        return {}
    try:
        shown = json.loads(raw)
    except ValueError:
        return {}
    keys = ("previous_response_id", "store")
    return {k: shown[k] for k in keys if k in shown} if isinstance(shown, dict) else {}


@router.post("/v1/responses", openapi_extra=RESPONSES_BODY, summary="Create a response")
async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.mlxbun
    body = wire.check_container(await read_json(request))
    conversation: list[dict[str, Any]] = []
    previous_id = body.get("previous_response_id")
    if previous_id is not None:
        record = state.responses.get(previous_id)
        if record is None:
            raise _not_found(previous_id, "previous_response_id", "previous_response_not_found")
        conversation = record.items + record.response["output"]
    parsed = wire.parse_request(body)
    conversation = conversation + parsed.items
    messages = wire.items_to_messages(parsed.instructions, conversation)
    not_ready = ready_or_error(state)
    if not_ready is not None:
        return not_ready
    state.counters.requests += 1
    prepared = _prepare(state, parsed, messages)
    run = _Run(state, parsed, conversation)
    run.shown = _shown_by_parent(request)
    events = stream_events(state, prepared)
    if parsed.stream:
        return EventStreamResponse(
            _stream(run, events),
            media_type="text/event-stream",
            headers=stream_headers(prepared),
        )
    async for event in unless_client_leaves(request.receive, events):
        run.builder.feed(event)
    done = run.builder.done
    if done is None or done.finish_reason == "error":
        state.counters.errors += 1
        message = (done.error if done else None) or "generation failed"
        return error_response(500, message, "server_error", path=request.url.path)
    if done.finish_reason == "cancelled":
        return error_response(503, _CANCELLED, "engine_unavailable", path=request.url.path)
    run.builder.finish(_outcome(done)[0])
    return JSONResponse(run.final(done), headers=prepared_headers(prepared))


@router.get("/v1/responses/{response_id}", summary="Retrieve a stored response")
async def get_response(response_id: str, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxbun
    record = state.responses.get(response_id)
    if record is None:
        raise _not_found(response_id)
    return JSONResponse(record.response)


@router.delete("/v1/responses/{response_id}", summary="Delete a stored response")
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxbun
    if not state.responses.delete(response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
