"""The isolated host: the parent that owns routing, residency and reports.

Each resident model runs in its own worker process (server/worker.py); this
process never imports mlx. It answers /health, /stats, /engine, /v1/models
and the model admin routes itself and forwards generation to the worker the
request's model names.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mlxbun_cli import __version__
from mlxbun_cli.catalog import ModelRef, known_models
from mlxbun_cli.errors import InputError
from mlxbun_cli.protocols import JSON_ERRORS, WireError, anthropic
from mlxbun_cli.server import errors, handoff, routes_jobs, routes_publishing
from mlxbun_cli.server.middleware import install_common
from mlxbun_cli.server.parent_responses import build_responses_router
from mlxbun_cli.server.proxy import forward, open_upstream
from mlxbun_cli.server.residency import AdmissionError, ModelRouter
from mlxbun_cli.server.responses_store import ResponseStore
from mlxbun_cli.server.schemas import CHAT_BODY, COMPLETION_BODY, EMBEDDINGS_BODY
from mlxbun_cli.server.state import ServeOptions
from mlxbun_cli.server.supervisor import EngineUnavailable

# Generation routes the workers answer; everything else is the parent's.
PROXIED = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/embeddings",
)


class ParentCounters:
    def __init__(self) -> None:
        self.requests = 0
        self.proxied = 0
        self.unavailable = 0
        self.admission_refusals = 0


def _peek(body: bytes) -> dict[str, Any]:
    """The routing fields of a JSON body; a body that is not JSON is the worker's to refuse."""
    try:
        data = json.loads(body)
    except JSON_ERRORS:
        return {}
    return data if isinstance(data, dict) else {}


def build_router(
    router: ModelRouter, counters: ParentCounters, started_at: float, store: ResponseStore
) -> tuple[APIRouter, Callable[[Request], Awaitable[Response]]]:
    """The parent's routes, and the proxying endpoint (also mounted as a plain route)."""
    api = APIRouter()

    async def lease_for(request: Request, fields: dict[str, Any]) -> Any:
        """A lease on the model the body names, or the error Response to send."""
        path = request.url.path
        try:
            return await router.lease(fields.get("model"), fields.get("keep_alive"))
        except AdmissionError as exc:
            counters.admission_refusals += 1
            return errors.error_response(
                400, exc.message, "invalid_request_error", "model", "memory_admission", path=path
            )
        except InputError as exc:
            return errors.error_response(
                400, exc.message, "invalid_request_error", "model", path=path
            )
        except EngineUnavailable as exc:
            counters.unavailable += 1
            return errors.error_response(
                502, str(exc), "engine_unavailable", None, "engine_unavailable", path=path
            )

    async def proxy(request: Request) -> Response:
        counters.requests += 1
        body = await request.body()
        fields = _peek(body)
        lease = await lease_for(request, fields)
        if isinstance(lease, Response):
            return lease
        counters.proxied += 1
        return await forward(request, lease, body, whole_answer=fields.get("stream") is not True)

    async def send(
        request: Request,
        lease: Any,
        body: bytes,
        offer: Any = None,
        extra: Any = (),
        whole_answer: bool = False,
    ) -> Any:
        counters.requests += 1
        counters.proxied += 1
        return await open_upstream(
            request, lease, body, offer=offer, extra_headers=extra, whole_answer=whole_answer
        )

    api.include_router(build_responses_router(store, lease_for, send))

    bodies = (
        CHAT_BODY,
        COMPLETION_BODY,
        anthropic.MESSAGES_BODY,
        anthropic.COUNT_TOKENS_BODY,
        EMBEDDINGS_BODY,
    )
    for route, extra in zip(PROXIED, bodies, strict=True):
        api.add_api_route(
            route,
            proxy,
            methods=["POST"],
            openapi_extra=extra,
            summary=f"Proxied to the model's worker: {route}",
        )

    @api.get("/health", summary="Aggregate health of the parent and its workers")
    async def health() -> JSONResponse:
        """200 while requests can be taken: the model ready, or loading (requests
        then wait for it, as a lease does). 503 while they would fail at once:
        a worker restarting after a crash, or one that failed."""
        workers = router.supervisor.workers
        current = workers.get(router.current)
        state = current.state if current is not None else "unloaded"
        if state == "starting" and current.restarts:
            state = "restarting"  # still recovering from a crash: not healthy until ready
        status = {"ready": "ok", "unloaded": "ok", "starting": "loading"}.get(state, state)
        body = {
            "status": status,
            "ready": state == "ready",
            "model": router.current,
            "uptime_s": round(time.time() - started_at, 1),
            "workers": {w.ref.id: w.state for w in workers.values()},
        }
        if current is not None and current.last_error:
            body["error"] = current.last_error
        return JSONResponse(body, status_code=200 if status in ("ok", "loading") else 503)

    async def worker_stats(worker: Any) -> dict[str, Any] | None:
        if worker.state != "ready" or worker.client is None:
            return None
        try:
            return (await worker.client.get("/stats", timeout=2.0)).json()
        except Exception:
            return None

    @api.get(
        "/engine", summary="The model workers: pid, state, restarts, socket, last exit, memory"
    )
    async def engine() -> dict[str, Any]:
        workers = list(router.supervisor.workers.values())
        stats = await asyncio.gather(*(worker_stats(w) for w in workers))
        out = []
        for worker, stat in zip(workers, stats, strict=True):
            entry = worker.describe()
            entry["memory"] = (stat or {}).get("memory")
            out.append(entry)
        spare = router.supervisor.standby
        standby = spare.pid if spare is not None and spare.poll() is None else None
        return {"mode": "isolated", "workers": out, "standby_pid": standby}

    @api.get("/stats", summary="Parent counters, residency, and each worker's engine stats")
    async def stats() -> dict[str, Any]:
        workers = list(router.supervisor.workers.values())
        per_worker = await asyncio.gather(*(worker_stats(w) for w in workers))
        return {
            "mode": "isolated",
            "uptime_s": round(time.time() - started_at, 1),
            "requests": counters.requests,
            "proxied": counters.proxied,
            "engine_unavailable": counters.unavailable,
            "admission_refusals": counters.admission_refusals,
            # event streams whose body the worker wrote to the client connection itself
            "handoffs": dict(handoff.stats),
            "residency": router.report(),
            "response_store": store.stats(),
            "workers": {w.ref.id: s for w, s in zip(workers, per_worker, strict=True)},
        }

    def model_entry(model_id: str) -> dict[str, Any]:
        worker = router.supervisor.workers.get(model_id)
        return {
            "id": model_id,
            "object": "model",
            "created": int(started_at),
            "owned_by": "local",
            "resident": worker is not None and worker.state == "ready",
            "current": model_id == router.current,
        }

    @api.get("/v1/models", summary="Every local model, with resident and current")
    async def list_models() -> dict[str, Any]:
        ids = [router.default.id] + [r.id for r in known_models() if r.id != router.default.id]
        return {"object": "list", "data": [model_entry(i) for i in ids]}

    @api.get("/v1/models/{model_id:path}", summary="One local model")
    async def get_model(model_id: str) -> Response:
        if model_id not in router.local_ids(fresh=True):
            return errors.error_response(
                404, f"no local model '{model_id}'", "not_found_error", "model"
            )
        return JSONResponse(model_entry(model_id))

    async def read_model_field(request: Request) -> tuple[str, dict[str, Any]]:
        try:
            data = json.loads(await request.body())
        except JSON_ERRORS:
            raise WireError("the body is not valid JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("model"), str):
            raise WireError("model (a string) is required", "model")
        return data["model"], data

    @api.post("/api/models/load", summary="Load a model (optionally pinned)")
    async def load(request: Request) -> Response:
        model, data = await read_model_field(request)
        if model not in router.local_ids(fresh=True):
            return errors.error_response(
                404, f"no local model '{model}'", "not_found_error", "model"
            )
        try:
            worker = await router.ensure(router.target_for(model), pin=bool(data.get("pin")))
            await router.supervisor.wait_ready(worker)
        except AdmissionError as exc:
            return errors.error_response(400, exc.message, code="memory_admission", param="model")
        except EngineUnavailable as exc:
            return errors.error_response(
                502, str(exc), "engine_unavailable", code="engine_unavailable"
            )
        return JSONResponse({"ok": True, "model": worker.describe()})

    @api.post("/api/models/unload", summary="Unload a resident model")
    async def unload(request: Request) -> Response:
        model, _ = await read_model_field(request)
        try:
            done = await router.unload(model)
        except InputError as exc:
            return errors.error_response(409, exc.message, param="model")
        if not done:
            return errors.error_response(
                404, f"model '{model}' is not resident", "not_found_error", "model"
            )
        return JSONResponse({"ok": True, "model": model})

    @api.get("/api/models/ps", summary="Resident models: memory, leases, idle time")
    async def ps() -> dict[str, Any]:
        return router.report()

    return api, proxy


def create_parent_app(
    options: ServeOptions, default: ModelRef, router: ModelRouter | None = None
) -> tuple[FastAPI, ModelRouter]:
    # The parent answers some errors on the Anthropic paths itself (401, 404, 413, 502).
    errors.register_error_shape("/v1/messages", anthropic.error_body)
    router = router or ModelRouter(options, default)
    counters = ParentCounters()
    started_at = time.time()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        await router.start()
        await routes_jobs.startup(app, options.api_key)
        yield
        await routes_jobs.shutdown(app)
        await router.shutdown()

    app = FastAPI(
        title="mlxbun",
        version=__version__,
        lifespan=lifespan,
        redoc_url=None,
        description="Local OpenAI/Anthropic-compatible server on MLX (isolated model workers).",
    )
    app.state.router = router
    store = ResponseStore(
        options.response_store_entries, options.response_store_bytes, options.response_store_ttl_s
    )
    api, proxy = build_router(router, counters, started_at, store)
    app.include_router(api)
    # The hot path skips FastAPI's per-request handling (dependency solving and
    # its included-router dispatch): plain Starlette routes for the proxied
    # paths, ahead of the FastAPI ones, which stay for the OpenAPI document.
    app.router.routes[:0] = [Route(path, proxy, methods=["POST"]) for path in PROXIED]
    app.include_router(routes_jobs.router)
    app.include_router(routes_publishing.router)
    install_common(app, options)
    return app, router


def parent_server(
    options: ServeOptions, default: ModelRef, router: ModelRouter | None = None
) -> tuple[Any, Any]:
    from mlxbun_cli.server.run import uvicorn_server

    app, router = create_parent_app(options, default, router)

    def drain() -> None:
        # The running job stops (resumable); workers drain their own streams with
        # final frames, and the parent waits for them.
        routes_jobs.drain(app)
        router.supervisor.signal_all(signal.SIGTERM)

    return uvicorn_server(app, options, on_exit=drain), router.supervisor.kill_all_now
