"""OpenAI wire: /v1/embeddings, on the model's engine thread (engine/embeddings.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from mlxbun_cli.engine import embeddings
from mlxbun_cli.engine.scheduler import EngineShutDown
from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep.templates import encode_prompt
from mlxbun_cli.protocols import WireError
from mlxbun_cli.protocols import openai as wire
from mlxbun_cli.server.disconnect import ClientGone, wait_for_disconnect
from mlxbun_cli.server.errors import error_response
from mlxbun_cli.server.routes_openai import read_json, ready_or_error
from mlxbun_cli.server.schemas import EMBEDDINGS_BODY
from mlxbun_cli.server.state import ServerState

router = APIRouter()

MAX_EMBEDDING_TOKENS = 300_000  # per request, as OpenAI's API


@router.post(
    "/v1/embeddings",
    openapi_extra=EMBEDDINGS_BODY,
    summary="Embeddings: the model's final hidden states, mean-pooled (OpenAI wire)",
)
async def create_embeddings(request: Request) -> Response:
    state: ServerState = request.app.state.mlxbun
    parsed = wire.parse_embeddings(await read_json(request))
    not_ready = ready_or_error(state)
    if not_ready is not None:
        return not_ready
    state.counters.requests += 1
    loaded = state.loaded
    if embeddings.text_model(loaded.model) is None:
        raise WireError(f"{loaded.id} has no transformer backbone to take embeddings from")
    token_lists = await asyncio.to_thread(_embedding_inputs, loaded, parsed.inputs)
    try:
        # One engine call per input: running requests decode between them.
        calls = [
            asyncio.wrap_future(
                loaded.scheduler.call(lambda t=t: embeddings.embed_one(loaded.model, t))
            )
            for t in token_lists
        ]
    except EngineShutDown:
        return _shutting_down()
    outcome = await _finish_or_give_up(request, state, calls)
    if outcome is not None:
        return outcome
    vectors = [c.result() for c in calls]
    if parsed.dimensions is not None and parsed.dimensions != len(vectors[0]):
        raise WireError(
            f"dimensions must be {len(vectors[0])} for this model (its hidden size): "
            "its embeddings cannot be shortened",
            "dimensions",
        )
    used = sum(len(t) for t in token_lists)
    body = await asyncio.to_thread(
        lambda: json.dumps(
            wire.embeddings_response(loaded.id, vectors, used, parsed.encoding_format)
        ).encode()
    )
    return Response(body, media_type="application/json")


async def _finish_or_give_up(
    request: Request, state: ServerState, calls: list[asyncio.Future]
) -> Response | None:
    """Wait for every input; None when all are done. A client that leaves, an
    input that fails, or a shutdown past its grace period cancels what is left."""
    pending = set(calls)
    deadline: float | None = None
    loop = asyncio.get_running_loop()
    gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        while pending:
            done, pending = await asyncio.wait(
                pending | {gone}, timeout=0.25, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(gone)
            if gone.done():
                raise ClientGone
            failed = next((c for c in done if not c.cancelled() and c.exception()), None)
            if failed is not None:
                error = failed.exception()
                if isinstance(error, EngineShutDown):
                    return _shutting_down()
                state.counters.errors += 1
                return error_response(500, f"embedding failed: {error}", "server_error")
            if not pending:
                return None
            if state.draining.is_set():
                deadline = deadline or loop.time() + state.options.shutdown_grace
                if loop.time() >= deadline:
                    return _shutting_down()
        return None
    finally:
        gone.cancel()
        for call in pending:
            call.cancel()  # the engine skips inputs it has not started


def _shutting_down() -> JSONResponse:
    return error_response(503, "the server is shutting down", "server_shutdown")


def _embedding_inputs(loaded: Any, items: list[str | list[int]]) -> list[list[int]]:
    token_lists = [_embedding_tokens(loaded, item, i) for i, item in enumerate(items)]
    total = sum(len(t) for t in token_lists)
    if total > MAX_EMBEDDING_TOKENS:
        raise WireError(
            f"input is {total} tokens in all; at most {MAX_EMBEDDING_TOKENS} per request", "input"
        )
    return token_lists


def _embedding_tokens(loaded: Any, item: str | list[int], index: int) -> list[int]:
    where = f"input[{index}]"
    if isinstance(item, str):
        try:
            tokens = encode_prompt(loaded.tokenizer, item)
        except OptionError as exc:
            raise WireError(f"{where} {str(exc).removeprefix('prompt: ')}", "input") from exc
    else:
        vocab = loaded.vocab_size
        bad = next((t for t in item if not 0 <= t < vocab), None)
        if bad is not None:
            raise WireError(
                f"{where} has token id {bad}, outside the vocabulary (0-{vocab - 1})", "input"
            )
        tokens = [int(t) for t in item]
    if not tokens:
        raise WireError(f"{where} encodes to no tokens", "input")
    if loaded.context_length and len(tokens) > loaded.context_length:
        raise WireError(
            f"{where} is {len(tokens)} tokens, more than the model's "
            f"{loaded.context_length}-token context",
            "input",
        )
    return tokens
