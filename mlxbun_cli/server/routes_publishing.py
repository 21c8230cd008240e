"""Publishing routes: the Hub token setting, and pushing a job's output or a path.

GET  /api/settings/hf-token          {"ok": true, "hasToken": bool}   (never the token)
POST /api/settings/hf-token {token}  {"ok": true, "user": ..., "warning": ...}; saved
                                     like `mlxbun push login`
POST /api/{quantize,finetune,dataset}/push {repo_id, job_id?, source_path?, private?}
                                     {"ok": true, "url": ...}

Validation in this order, as mlx-bun's publishing routes: a JSON object; then
`token` (a non-empty string), or `repo_id` (a non-empty string), `job_id` and
`source_path` (non-empty strings when given), `private` (a boolean when given).
Every failure is {"ok": false, "error": message} with 400; a request whose client
went away answers 499. The push runs in a thread (huggingface_hub is sync); a
client that disconnects sets its cancel event, so it stops before its commit.
Nothing here imports mlx: the isolated daemon's parent serves these routes too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from fastapi import APIRouter, Request
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from mlxbun_cli.errors import MlxbunError
from mlxbun_cli.protocols import JSON_ERRORS
from mlxbun_cli.server.errors import register_error_shape

log = logging.getLogger("mlxbun.publishing")
router = APIRouter()
TOKEN_PATH = "/api/settings/hf-token"
PUSH_KINDS = ("quantize", "finetune", "dataset")
DISCONNECT_POLL_S = 0.1


def _body(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """The OpenAPI request body (the routes parse bodies themselves)."""
    schema = {"type": "object", "required": required, "properties": properties}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


TOKEN_BODY = _body({"token": {"type": "string", "minLength": 1}}, ["token"])
PUSH_BODY = _body(
    {
        "repo_id": {"type": "string", "description": "ORG/NAME, or NAME in the token's namespace"},
        "job_id": {"type": "string", "description": "a succeeded job of this kind"},
        "source_path": {"type": "string", "description": "an absolute path, instead of job_id"},
        "private": {"type": "boolean", "description": "make the repo private when created"},
    },
    ["repo_id"],
)


def error_shape(message: str, type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"ok": False, "error": message}


for _path in (TOKEN_PATH, *(f"/api/{kind}/push" for kind in PUSH_KINDS)):
    register_error_shape(_path, error_shape)


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"ok": False, "error": message}, status_code=status)


def _cancelled() -> JSONResponse:
    return _error("Request cancelled", 499)


async def _json_object(request: Request) -> dict[str, Any] | Response:
    """The body as a JSON object, or the response to send (400, or 499 when the client left)."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        return _cancelled()
    if await request.is_disconnected():
        return _cancelled()
    try:
        body = json.loads(raw)
    except JSON_ERRORS:
        body = None
    if not isinstance(body, dict):
        return _error("expected a JSON object")
    return body


@router.get(TOKEN_PATH, summary="Whether a Hugging Face token is set (never the token)")
async def get_token(request: Request) -> Response:
    from mlxbun_cli.publishing import credentials

    if await request.is_disconnected():
        return _cancelled()
    try:
        found = await asyncio.to_thread(credentials.resolve)
    except MlxbunError as exc:
        return _error(exc.message)
    return JSONResponse({"ok": True, "hasToken": found is not None})


@router.post(
    TOKEN_PATH,
    openapi_extra=TOKEN_BODY,
    summary="Save the Hugging Face token (checked with the Hub when it can be)",
)
async def save_token(request: Request) -> Response:
    from mlxbun_cli.publishing import credentials

    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    token = body.get("token")
    if not isinstance(token, str) or not token.strip():
        return _error("token required")
    try:
        result = await asyncio.to_thread(credentials.login, token)
    except MlxbunError as exc:
        return _error(exc.message)
    return JSONResponse({"ok": True, "user": result.user, "warning": result.warning})


def _push_fields(body: dict[str, Any]) -> dict[str, Any] | str:
    """The push request's fields, or the message that names the bad one."""
    repo_id = body.get("repo_id")
    if not isinstance(repo_id, str) or not repo_id.strip():
        return "repo_id required"
    for key in ("job_id", "source_path"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            return f"{key} must be a nonempty string"
    if body.get("private") is not None and not isinstance(body["private"], bool):
        return "private must be a boolean"
    return {
        "repo_id": repo_id,
        "job_id": body.get("job_id"),
        "source_path": body.get("source_path"),
        "private": body.get("private"),
    }


def _push_route(kind: str) -> Any:
    async def push(request: Request) -> Response:
        body = await _json_object(request)
        if isinstance(body, Response):
            return body
        fields = _push_fields(body)
        if isinstance(fields, str):
            return _error(fields)
        return await _run_push(request, kind, fields)

    push.__name__ = f"push_{kind}"
    return push


async def _run_push(request: Request, kind: str, fields: dict[str, Any]) -> Response:
    from mlxbun_cli.publishing.push import publish

    cancelled = threading.Event()
    work = asyncio.ensure_future(
        asyncio.to_thread(publish, kind=kind, cancelled=cancelled, **fields)
    )
    while not work.done():
        await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
        if not work.done() and await request.is_disconnected():
            cancelled.set()
            work.add_done_callback(_log_after_cancel)
            return _cancelled()
    try:
        result = work.result()
    except MlxbunError as exc:
        if cancelled.is_set() or await request.is_disconnected():
            return _cancelled()
        return _error(exc.message)
    return JSONResponse({"ok": True, "url": result.url})


def _log_after_cancel(work: asyncio.Future) -> None:
    """The push a departed client started: how it ended (and its exception retrieved)."""
    if work.cancelled():
        return
    exc = work.exception()
    if exc is None:
        log.info("a push whose client left finished: %s", work.result().url)
    else:
        log.info("a push whose client left stopped: %s", getattr(exc, "message", exc))


for _kind in PUSH_KINDS:
    router.add_api_route(
        f"/api/{_kind}/push",
        _push_route(_kind),
        methods=["POST"],
        openapi_extra=PUSH_BODY,
        summary=f"Push a {_kind} job's output (or source_path) to the Hugging Face Hub",
    )
