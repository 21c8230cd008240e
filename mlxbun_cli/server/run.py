"""Running the server: bind, register as the daemon, serve, shut down gracefully."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from mlxbun_cli.catalog import resolve
from mlxbun_cli.client import daemon
from mlxbun_cli.errors import MlxbunError
from mlxbun_cli.server.state import ServeOptions, ServerState

log = logging.getLogger("mlxbun.server")


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise MlxbunError(
                f"port {port} on {host} is already in use",
                hint="choose another with --port (0 picks a free one)",
            ) from exc
        raise MlxbunError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def uvicorn_server(
    app: Any,
    options: ServeOptions,
    on_startup: Callable[[asyncio.AbstractEventLoop], None] | None = None,
    on_exit: Callable[[], None] | None = None,
) -> Any:
    """A uvicorn server whose SIGTERM/SIGINT starts a graceful drain and exits 0."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)
            # A signal-initiated graceful shutdown is a clean exit (0); uvicorn
            # would otherwise re-raise the signal once it is done.
            self._captured_signals.clear()

        async def startup(self, sockets: Any = None) -> None:
            if on_startup is not None:
                on_startup(asyncio.get_running_loop())
            await super().startup(sockets=sockets)

    from mlxbun_cli.server.direct_write import capture_server_cycle

    config = uvicorn.Config(
        capture_server_cycle(app),
        log_level=options.log_level,
        timeout_graceful_shutdown=int(options.shutdown_grace) + 5,
        access_log=options.log_level == "debug",
        lifespan="on",
    )
    return GracefulServer(config)


def engine_server(state: ServerState) -> Any:
    """The in-process server: this process loads the model and generates."""
    from mlxbun_cli.server.app import create_app

    def startup(loop: asyncio.AbstractEventLoop) -> None:
        from mlxbun_cli.server import handoff

        state.loop = loop
        state.draining = asyncio.Event()
        handoff.start(loop)  # a worker takes client connections from its parent

    def drain() -> None:
        loop = getattr(state, "loop", None)
        if loop is not None:
            loop.call_soon_threadsafe(state.draining.set)

    return uvicorn_server(create_app(state), state.options, startup, drain)


def serve(options: ServeOptions, default_model: str | None = None, on_ready: Any = None) -> None:
    """Serve until SIGTERM/SIGINT. Returns normally on a clean shutdown."""
    ref = resolve(options.model, default_model)
    lock = daemon.DaemonLock()
    lock.acquire()
    sock = bind(options.host, options.port)
    port = sock.getsockname()[1]
    url = _url(options.host, port)
    if options.isolated:
        from mlxbun_cli.server.residency import ModelRouter

        # The worker starts first: its imports and load overlap the parent's.
        router = ModelRouter(options, ref)
        router.prestart_default()
        try:
            from mlxbun_cli.server.parent import parent_server

            server, cleanup = parent_server(options, ref, router)
        except BaseException:
            router.supervisor.kill_all_now()
            raise
    else:
        state = ServerState(options, ref)
        state.start_loading()
        server, cleanup = engine_server(state), None
    daemon.write_state(
        daemon.DaemonInfo(
            pid=os.getpid(),
            url=url,
            model=ref.id,
            started_at=time.time(),
            log=str(daemon.log_file()),
            api_key_set=bool(options.api_key),
        )
    )
    if on_ready is not None:
        on_ready(url, ref)
    try:
        server.run(sockets=[sock])
    finally:
        if cleanup is not None:
            cleanup()
        daemon.clear_state(os.getpid())
        lock.release()
        sock.close()
