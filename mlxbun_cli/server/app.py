"""The ASGI app: route groups composed, errors in the OpenAI shape, middleware."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from mlxbun_cli import __version__
from mlxbun_cli.server import (
    routes_admin,
    routes_anthropic,
    routes_embeddings,
    routes_jobs,
    routes_openai,
    routes_publishing,
    routes_responses,
)
from mlxbun_cli.server.middleware import install_common
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
    app.include_router(routes_embeddings.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_anthropic.router)
    app.include_router(routes_jobs.router)
    app.include_router(routes_publishing.router)
    install_common(app, state.options)
    return app
