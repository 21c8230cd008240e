"""Health and statistics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from mlxbun_cli.server.state import ServerState

router = APIRouter()


def _memory() -> dict[str, int]:
    import mlx.core as mx

    return {
        "active_bytes": int(mx.get_active_memory()),
        "cache_bytes": int(mx.get_cache_memory()),
        "peak_bytes": int(mx.get_peak_memory()),
    }


@router.get("/health", summary="Liveness and model readiness")
async def health(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.mlxbun
    body: dict[str, Any] = {
        "status": state.status,
        "ready": state.status == "ok",
        "model": state.ref.id,
        "uptime_s": round(time.time() - state.started_at, 1),
    }
    if state.load_error:
        body["error"] = state.load_error
    return JSONResponse(body, status_code=200 if state.status == "ok" else 503)


@router.get("/stats", summary="Request, token, cache and memory counters")
async def stats(request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.mlxbun
    c = state.counters
    out: dict[str, Any] = {
        "status": state.status,
        "model": state.ref.id,
        "uptime_s": round(time.time() - state.started_at, 1),
        "requests": c.requests,
        "errors": c.errors,
        "client_disconnects": c.client_disconnects,
        "shutdown_cancels": c.shutdown_cancels,
        "tool_parse_failures": c.tool_parse_failures,
        "streams_active": c.streams_active,
        "response_store": state.responses.stats(),
    }
    loaded = state.loaded
    if loaded is not None:
        sched = loaded.scheduler
        s = sched.stats
        out["engine"] = {
            "requests": s.requests,
            "completed": s.completed,
            "cancelled": s.cancelled,
            "errors": s.errors,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "generated_tokens": s.generated_tokens,
            "cache_hits": s.cache_hits,
            "active": sched.active_count,
            "queue_depth": sched.queue_depth,
            "tokens_per_busy_second": round(s.generated_tokens / s.busy_seconds, 2)
            if s.busy_seconds
            else 0.0,
            "compiled_decode": sched.compiled_decode_state,
        }
        out["prompt_cache"] = sched.cache_info()
        out["memory"] = _memory()
    return out
