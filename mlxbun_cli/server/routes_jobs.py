"""Job routes: list, show, stream (SSE), submit, cancel, resume, remove.

GET    /api/jobs?limit=&kind=&state=   {"ok": true, "jobs": [...]}
GET    /api/jobs/{id}                  {"ok": true, "job": {...}}   404 {"ok": false, "error": "job not found"}
GET    /api/jobs/{id}/events?after=   {"ok": true, "events": [...]}
GET    /api/jobs/{id}/stream           SSE: past events replayed, then live, until the job ends
POST   /api/jobs   {kind, params}      201 {"ok": true, "job": {...}}; 400 names the field
POST   /api/jobs/{id}/cancel           {"ok": true, "job": {...}}; 409 when already finished
POST   /api/jobs/{id}/resume           {"ok": true, "job": {...}}; 409 unless resumable
DELETE /api/jobs/{id}?outputs=true     {"ok": true, "removed": [...]}

The manager runs in the process clients know as the daemon (the one in the
daemon state file), never in a model worker. An app that includes this
router calls `startup` and `shutdown` from its lifespan, and `drain` (or
passes its draining asyncio.Event to `startup`) when a SIGTERM starts the
shutdown, so a running job stops as `interrupted` before streams close.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from mlxbun_cli.errors import InputError, MlxbunError, OptionError
from mlxbun_cli.jobs import KINDS, STATES
from mlxbun_cli.protocols import JSON_ERRORS
from mlxbun_cli.server.errors import register_error_shape

log = logging.getLogger("mlxbun.jobs")
router = APIRouter()
POLL_SECONDS = 0.2
HEARTBEAT_SECONDS = 15.0


def error_shape(message: str, type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"ok": False, "error": message, "type": type, "field": param}


register_error_shape("/api/jobs", error_shape)


def _fail(
    status: int, message: str, field: str | None = None, type: str | None = None
) -> JSONResponse:
    kind = type or {404: "not_found_error", 409: "conflict_error"}.get(
        status, "invalid_request_error"
    )
    return JSONResponse(error_shape(message, kind, field, None), status_code=status)


def _error(exc: MlxbunError) -> JSONResponse:
    from mlxbun_cli.jobs.store import JobNotFoundError, JobStateError

    if isinstance(exc, JobNotFoundError):
        return _fail(404, "job not found", "id")
    if isinstance(exc, JobStateError):
        return _fail(409, exc.message)
    if isinstance(exc, OptionError):
        return _fail(400, exc.message, exc.field)
    if isinstance(exc, InputError):
        return _fail(400, exc.message)
    return _fail(500, exc.message, type="server_error")


def _manager(request: Request) -> Any:
    return getattr(request.app.state, "jobs", None)


def _unavailable() -> JSONResponse:
    return _fail(
        503, "jobs run in the mlxbun daemon; this server does not run them", type="unavailable"
    )


async def _call(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


# -- lifespan hooks ------------------------------------------------------------------


def _own_url(app: Any) -> str:
    """The URL this server answers on, for the dataset runner's RemoteBackend."""
    url = getattr(app.state, "jobs_base_url", None)
    if url:
        return url
    from mlxbun_cli.client import daemon

    info = daemon.read_state(clean_stale=False)
    if info is not None and info.pid == os.getpid():
        return info.url
    from mlxbun_cli.errors import BackendUnavailableError

    raise BackendUnavailableError("the server does not know its own URL")


def _is_daemon() -> bool:
    from mlxbun_cli.client import daemon

    info = daemon.read_state(clean_stale=False)
    return info is not None and info.pid == os.getpid()


def _backend_factory(app: Any, api_key: str | None) -> Any:
    def make(ctx: Any) -> Any:
        from mlxbun_cli.client.remote import RemoteBackend

        url = _own_url(app)
        wait_ready(url, ctx.stop)
        return RemoteBackend(url, model=ctx.params.get("model"), api_key=api_key)

    return make


def wait_ready(url: str, stop: Any, timeout: float = 600.0) -> None:
    """Wait for the model to be loaded (a job queued at start-up may come first)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        try:
            response = httpx.get(f"{url}/health", timeout=5.0)
            body = response.json()
        except (httpx.HTTPError, ValueError):
            body = {}
        else:
            if response.status_code == 200:
                return
            if body.get("status") == "error":
                raise MlxbunError(f"the server's model failed to load: {body.get('error')}")
        time.sleep(0.5)


async def startup(app: Any, api_key: str | None = None, draining: Any = None) -> None:
    """Start the job manager when this process is the daemon."""
    if getattr(app.state, "jobs", None) is not None or not (
        getattr(app.state, "jobs_base_url", None) or _is_daemon()
    ):
        return
    from mlxbun_cli.jobs.manager import JobManager
    from mlxbun_cli.jobs.store import JobStore

    store = await _call(JobStore)
    manager = JobManager(store, _backend_factory(app, api_key))
    interrupted = await _call(manager.start)
    if interrupted:
        log.warning("jobs left running by a stopped daemon are now interrupted: %s", interrupted)
    app.state.jobs = manager
    if draining is not None:
        # A drain (SIGTERM) stops the running job at once, resumable, before streams close.
        async def on_drain() -> None:
            await draining.wait()
            manager.interrupt()

        app.state.jobs_drain_task = asyncio.ensure_future(on_drain())


def drain(app: Any) -> None:
    """Call when a shutdown starts (from any thread): the running job stops, resumable."""
    manager = getattr(app.state, "jobs", None)
    if manager is not None:
        manager.interrupt()


async def shutdown(app: Any, timeout: float = 20.0) -> None:
    manager = getattr(app.state, "jobs", None)
    task = getattr(app.state, "jobs_drain_task", None)
    if task is not None:
        task.cancel()
    if manager is not None:
        await _call(manager.stop, timeout)
        app.state.jobs = None


# -- routes --------------------------------------------------------------------------


@router.get("/api/jobs", summary="Recent jobs, newest first")
async def list_jobs(request: Request) -> Response:
    manager = _manager(request)
    if manager is None:
        return _unavailable()
    query = request.query_params
    try:
        limit = int(query.get("limit", "50"))
    except ValueError:
        return _fail(400, "limit must be an integer", "limit")
    if not 0 <= limit <= 10_000:
        return _fail(400, "limit must be from 0 to 10000", "limit")
    kind, state = query.get("kind") or None, query.get("state") or None
    if kind is not None and kind not in KINDS:
        return _fail(400, f"kind must be one of {', '.join(KINDS)}", "kind")
    if state is not None and state not in STATES:
        return _fail(400, f"state must be one of {', '.join(STATES)}", "state")
    jobs = await _call(manager.store.recent, limit, kind, state)
    return JSONResponse({"ok": True, "jobs": [job.as_dict() for job in jobs]})


@router.post("/api/jobs", summary="Queue a job: {kind, params}", status_code=201)
async def submit(request: Request) -> Response:
    manager = _manager(request)
    if manager is None:
        return _unavailable()
    try:
        body = json.loads(await request.body())
    except JSON_ERRORS as exc:
        return _fail(400, f"the body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return _fail(400, "the body must be a JSON object: {kind, params}")
    try:
        job = await _call(manager.submit, body.get("kind"), body.get("params"), None)
    except MlxbunError as exc:
        return _error(exc)
    return JSONResponse({"ok": True, "job": job.as_dict()}, status_code=201)


async def _resolve(request: Request, job_id: str) -> Any:
    return await _call(_manager(request).store.resolve, job_id)


@router.get("/api/jobs/{job_id}", summary="One job")
async def get_job(job_id: str, request: Request) -> Response:
    if _manager(request) is None:
        return _unavailable()
    try:
        job = await _resolve(request, job_id)
    except MlxbunError as exc:
        return _error(exc)
    return JSONResponse({"ok": True, "job": job.as_dict()})


@router.post("/api/jobs/{job_id}/cancel", summary="Cancel a queued or running job")
async def cancel(job_id: str, request: Request) -> Response:
    return await _act(request, job_id, "cancel")


@router.post(
    "/api/jobs/{job_id}/resume", summary="Queue an interrupted, failed or cancelled job again"
)
async def resume(job_id: str, request: Request) -> Response:
    return await _act(request, job_id, "resume")


async def _act(request: Request, job_id: str, action: str) -> Response:
    """Run one manager action (cancel, resume) on a job and answer with the job."""
    manager = _manager(request)
    if manager is None:
        return _unavailable()
    try:
        job = await _resolve(request, job_id)
        job = await _call(getattr(manager, action), job.id)
    except MlxbunError as exc:
        return _error(exc)
    return JSONResponse({"ok": True, "job": job.as_dict()})


@router.delete("/api/jobs/{job_id}", summary="Forget a finished job (outputs=true: and its files)")
async def remove(job_id: str, request: Request) -> Response:
    manager = _manager(request)
    if manager is None:
        return _unavailable()
    outputs = request.query_params.get("outputs", "").lower() in ("1", "true", "yes")
    try:
        job = await _resolve(request, job_id)
        removed = await _call(manager.remove, job.id, outputs)
    except MlxbunError as exc:
        return _error(exc)
    return JSONResponse({"ok": True, "id": job.id, "removed": removed})


@router.get("/api/jobs/{job_id}/events", summary="A job's past events: ?after=SEQ&limit=N")
async def events(job_id: str, request: Request) -> Response:
    if _manager(request) is None:
        return _unavailable()
    try:
        after = max(0, int(request.query_params.get("after", "0")))
        limit = min(10_000, max(1, int(request.query_params.get("limit", "1000"))))
    except ValueError:
        return _fail(400, "after and limit must be integers", "after")
    try:
        job = await _resolve(request, job_id)
    except MlxbunError as exc:
        return _error(exc)
    found = await _call(_manager(request).store.events, job.id, after, limit)
    return JSONResponse({"ok": True, "events": [event.as_dict() for event in found]})


def sse_frame(event: Any) -> bytes:
    data = json.dumps(event.as_dict(), ensure_ascii=False)
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


@router.get("/api/jobs/{job_id}/stream", summary="Job events as SSE: replayed, then live")
async def stream(job_id: str, request: Request) -> Response:
    manager = _manager(request)
    if manager is None:
        return _unavailable()
    try:
        job = await _resolve(request, job_id)
    except MlxbunError as exc:
        return _error(exc)
    after = request.query_params.get("after") or request.headers.get("last-event-id") or "0"
    try:
        start = max(0, int(after))
    except ValueError:
        return _fail(400, "after must be an event sequence number", "after")
    state = getattr(request.app.state, "mlxbun", None)
    draining = getattr(state, "draining", None)
    return StreamingResponse(
        _events(manager.store, job.id, start, draining),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(store: Any, job_id: str, after: int, draining: Any) -> AsyncIterator[bytes]:
    last, quiet_since = after, time.monotonic()
    while True:
        events = await _call(store.events, job_id, last, 500)
        for event in events:
            yield sse_frame(event)
            last = event.seq
        if events:
            quiet_since = time.monotonic()
            if len(events) == 500:
                continue
        job = await _call(store.get, job_id)
        if job is None:
            yield b'event: end\ndata: {"job": null, "reason": "removed"}\n\n'
            return
        if job.finished:
            for event in await _call(store.events, job_id, last, 10_000):
                yield sse_frame(event)  # written between the two reads
            yield _end(job.as_dict(), "finished")
            return
        if draining is not None and draining.is_set():
            yield _end(job.as_dict(), "server_shutdown")
            return
        if time.monotonic() - quiet_since > HEARTBEAT_SECONDS:
            quiet_since = time.monotonic()
            yield b": ping\n\n"  # finds a client that left without a word
        await asyncio.sleep(POLL_SECONDS)


def _end(job: dict[str, Any], reason: str) -> bytes:
    data = json.dumps({"job": job, "reason": reason}, ensure_ascii=False)
    return f"event: end\ndata: {data}\n\n".encode()
