"""The ASGI app driven in process (httpx's ASGI transport): states a subprocess can't hold still."""

from __future__ import annotations

import asyncio

import httpx

from mlxbun_cli.catalog import ModelRef
from mlxbun_cli.server.app import create_app
from mlxbun_cli.server.state import ServeOptions, ServerState


def call(app, method: str, path: str, **kwargs) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def loading_app(tmp_path, **options) -> object:
    # A state that never started loading: what every route sees while a model loads.
    state = ServerState(ServeOptions(**options), ModelRef("m", tmp_path, "path"))
    return create_app(state)


def test_503_while_loading_on_every_wire(tmp_path):
    app = loading_app(tmp_path)
    health = call(app, "GET", "/health")
    assert health.status_code == 503 and health.json()["status"] == "loading"
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    chat = call(app, "POST", "/v1/chat/completions", json=body)
    assert chat.status_code == 503 and chat.json()["error"]["type"] == "engine_unavailable"
    assert chat.headers["retry-after"] == "1"
    messages = call(app, "POST", "/v1/messages", json=body)
    assert messages.status_code == 503 and messages.json()["type"] == "error"


def test_cors_is_configurable(tmp_path):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    default = call(loading_app(tmp_path), "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert default.headers["access-control-allow-origin"] in ("*", "http://app.example")
    narrow = loading_app(tmp_path, cors_origins=["http://only.example"])
    refused = call(narrow, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in refused.headers
    allowed = call(
        narrow,
        "OPTIONS",
        "/v1/chat/completions",
        headers={**preflight, "Origin": "http://only.example"},
    )
    assert allowed.headers["access-control-allow-origin"] == "http://only.example"
    off = call(
        loading_app(tmp_path, cors_origins=[]), "OPTIONS", "/v1/chat/completions", headers=preflight
    )
    assert "access-control-allow-origin" not in off.headers


def test_errors_take_the_shape_of_their_wire(tmp_path):
    app = loading_app(tmp_path, api_key="k")
    openai_401 = call(app, "POST", "/v1/chat/completions", json={})
    assert openai_401.status_code == 401 and "error" in openai_401.json()
    anthropic_401 = call(app, "POST", "/v1/messages", json={})
    assert anthropic_401.status_code == 401 and anthropic_401.json()["type"] == "error"
    assert call(app, "GET", "/health").status_code == 503  # open without a key


def test_fast_content_chunks_are_the_same_bytes_as_full_ones():
    import json

    from mlxbun_cli.protocols import openai as wire
    from mlxbun_cli.server.routes_openai import _CONTENT_SUFFIX, _content_chunk_prefix, sse

    for text in ["hi", 'a "quote" \\ é 🙂\n', ""]:
        full = sse(wire.chat_chunk("chatcmpl-1", "org/model", 123, {"content": text}))
        fast = (
            _content_chunk_prefix("chatcmpl-1", "org/model", 123)
            + json.dumps(text, ensure_ascii=False).encode()
            + _CONTENT_SUFFIX
        )
        assert fast == full


def test_isolated_parent_health_is_200_while_its_worker_loads(tmp_path):
    # The parent takes requests while the worker loads (they wait for it), so
    # /health says "loading" with 200; a crashed or failed worker is a 503.
    from mlxbun_cli.server.parent import create_parent_app
    from mlxbun_cli.server.supervisor import Worker

    ref = ModelRef("m", tmp_path, "path")
    app, router = create_parent_app(ServeOptions(), ref)
    worker = Worker(ref, None, str(tmp_path / "w.sock"), 0)
    router.supervisor.workers[ref.id] = worker
    expected = {
        "starting": (200, "loading", False),
        "ready": (200, "ok", True),
        "restarting": (503, "restarting", False),
        "failed": (503, "failed", False),
    }
    for state, (code, status, ready) in expected.items():
        worker.state = state
        health = call(app, "GET", "/health")
        assert (health.status_code, health.json()["status"], health.json()["ready"]) == (
            code,
            status,
            ready,
        ), state


def test_isolated_parent_documents_the_proxied_routes(tmp_path):
    # The proxied paths are served by plain routes (the hot path) placed ahead
    # of FastAPI's, which must still describe them in the OpenAPI document.
    from mlxbun_cli.server.parent import PROXIED, create_parent_app

    app, _ = create_parent_app(ServeOptions(), ModelRef("m", tmp_path, "path"))
    paths = call(app, "GET", "/openapi.json").json()["paths"]
    for path in PROXIED:
        assert "requestBody" in paths[path]["post"], path
    first: dict[str, str] = {}  # the first route matching a path is the one that serves it
    for route in app.router.routes:
        path = getattr(route, "path", None)
        if path in PROXIED and path not in first:
            first[path] = type(route).__name__
    assert first == dict.fromkeys(PROXIED, "Route")
