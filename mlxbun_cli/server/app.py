"""The ASGI app: route groups composed, errors in the OpenAI shape, middleware."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from mlxbun_cli import __version__
from mlxbun_cli.errors import MlxbunError
from mlxbun_cli.protocols import WireError
from mlxbun_cli.server import (
    errors,
    routes_admin,
    routes_anthropic,
    routes_jobs,
    routes_openai,
    routes_responses,
)
from mlxbun_cli.server.middleware import ApiKeyMiddleware, BodyLimitMiddleware
from mlxbun_cli.server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        await routes_jobs.startup(app, state.options.api_key, state.draining)
        yield
        await routes_jobs.shutdown(app)
        state.close()

    app = FastAPI(
        title="mlxbun",
        version=__version__,
        description="Local OpenAI-compatible server on MLX.",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.mlxbun = state
    app.include_router(routes_admin.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_anthropic.router)
    app.include_router(routes_jobs.router)
    app.add_exception_handler(WireError, errors.wire_error)
    app.add_exception_handler(MlxbunError, errors.mlxbun_error)
    app.add_exception_handler(StarletteHTTPException, errors.http_error)
    app.add_exception_handler(Exception, errors.unexpected_error)
    options = state.options
    if options.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=options.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Warning", "X-Max-Tokens-Clamped"],
        )
    if options.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=options.api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=options.max_body_bytes)
    return app
