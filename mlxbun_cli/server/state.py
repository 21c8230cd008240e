"""What one server process knows: its settings, its model, its counters."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from mlxbun_cli.catalog import ModelRef
from mlxbun_cli.server.responses_store import ResponseStore


@dataclass
class ServeOptions:
    model: str | None = None
    adapter: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=lambda: ["*"])
    max_body_bytes: int = 16 * 1024 * 1024
    enable_thinking: bool | None = None
    default_max_tokens: int | None = None
    cache_bytes: int = 1 << 30
    cache_entries: int = 16
    compiled_decode: bool = True
    standby: bool = True  # isolated mode: keep a spare, pre-imported worker process
    shutdown_grace: float = 5.0
    constrained_decoding: bool = True
    isolated: bool = False  # each model in its own worker process
    memory_budget: int | None = None  # bytes for resident models (isolated mode)
    max_models: int = 2
    pinned: list[str] = field(default_factory=list)
    keep_alive: float | None = None  # idle seconds before a model unloads (None: never)
    memory_ceiling: int | None = None  # bytes the engine's model may use (admission)
    log_level: str = "info"
    # The Responses wire's stored responses (previous_response_id, GET): in memory.
    response_store_entries: int = 1000
    response_store_bytes: int = 64 * 1024 * 1024
    response_store_ttl_s: float = 3600.0


@dataclass
class RequestCounters:
    requests: int = 0
    errors: int = 0
    client_disconnects: int = 0
    shutdown_cancels: int = 0
    tool_parse_failures: int = 0
    streams_active: int = 0


class ServerState:
    def __init__(self, options: ServeOptions, ref: ModelRef) -> None:
        self.options = options
        self.ref = ref
        self.loaded: Any = None
        self.load_error: str | None = None
        self.started_at = time.time()
        self.counters = RequestCounters()
        self.draining = asyncio.Event()
        self._load_thread: threading.Thread | None = None
        self.responses = ResponseStore(
            options.response_store_entries,
            options.response_store_bytes,
            options.response_store_ttl_s,
        )

    @property
    def status(self) -> str:
        if self.load_error:
            return "error"
        return "ok" if self.loaded is not None else "loading"

    def prepare(self, req: Any) -> Any:
        """Shared prep with this server's defaults: every wire calls this."""
        from mlxbun_cli.prep.pipeline import prepare

        return prepare(
            self.loaded,
            req,
            server_thinking=self.options.enable_thinking,
            default_max_tokens=self.options.default_max_tokens,
            constrained_decoding=self.options.constrained_decoding,
        )

    def start_loading(self) -> None:
        def load() -> None:
            from mlxbun_cli.engine.loader import load_model
            from mlxbun_cli.errors import MlxbunError

            try:
                loaded = load_model(
                    self.ref,
                    self.options.adapter,
                    memory_ceiling=self.options.memory_ceiling,
                    cache_bytes=self.options.cache_bytes,
                    cache_entries=self.options.cache_entries,
                    compiled_decode=self.options.compiled_decode,
                )
                _ = loaded.scheduler  # start the scheduler thread before serving
                self.loaded = loaded
            except MlxbunError as exc:
                self.load_error = exc.message
            except Exception as exc:  # reported by /health, never a crash loop
                self.load_error = f"{type(exc).__name__}: {exc}"

        self._load_thread = threading.Thread(target=load, name="mlxbun-load", daemon=True)
        self._load_thread.start()

    def wait_loaded(self, timeout: float | None = None) -> None:
        if self._load_thread is not None:
            self._load_thread.join(timeout)

    def close(self) -> None:
        self.wait_loaded(30)
        if self.loaded is not None:
            self.loaded.close()
