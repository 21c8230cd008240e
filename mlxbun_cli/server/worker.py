"""A model worker: the in-process server for one model, on a Unix socket.

The isolated parent starts one per resident model (`python -m
mlxbun_cli.server.worker …`) and proxies requests to it. Auth, CORS and body
limits are the parent's job; the worker trusts its socket.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from mlxbun_cli.catalog import ModelRef
from mlxbun_cli.server.state import ServeOptions, ServerState

COMMAND = [sys.executable, "-m", "mlxbun_cli.server.worker"]


def worker_args(
    options: ServeOptions,
    ref: ModelRef,
    socket_path: str,
    adapter: str | None,
    memory_ceiling: int | None = None,
) -> list[str]:
    """The worker's flags (after COMMAND: a standby reads them from stdin)."""
    worker_options = {
        **asdict(options),
        "isolated": False,
        "api_key": None,
        "cors_origins": [],
        "model": ref.id,
        "adapter": adapter,
        "memory_ceiling": memory_ceiling,
    }
    return [
        "--socket",
        socket_path,
        "--model-id",
        ref.id,
        "--model-path",
        str(ref.path),
        "--source",
        ref.source,
        "--options",
        json.dumps(worker_options),
        "--parent-pid",
        str(os.getpid()),
    ]


def standby_args() -> list[str]:
    """A spare worker: imports everything, then reads its worker arguments from stdin."""
    return [
        *COMMAND,
        "--standby",
        "--parent-pid",
        str(os.getpid()),
    ]


def _exit_with_parent(parent: int, every_s: float = 0.5) -> None:
    """Drain and exit once the parent is gone (even killed with SIGKILL).

    Workers run in their own session, so no signal reaches them when the
    parent dies; without this they would hold their model's memory forever.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)  # the same graceful drain as a stop

    threading.Thread(target=watch, name="mlxbun-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mlxbun-worker")
    parser.add_argument("--socket")
    parser.add_argument("--model-id")
    parser.add_argument("--model-path")
    parser.add_argument("--source", default="path")
    parser.add_argument("--options")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--standby", action="store_true")
    args = parser.parse_args(argv)
    _exit_with_parent(args.parent_pid or os.getppid())
    if args.standby:
        # The slow part of a worker's start, done before it is needed.
        import mlx_lm  # noqa: F401

        import mlxbun_cli.server.app  # noqa: F401

        line = sys.stdin.readline()
        if not line:  # the parent let it go unused
            return 0
        args = parser.parse_args(json.loads(line))
    if not (args.socket and args.model_id and args.model_path and args.options):
        parser.error("--socket, --model-id, --model-path and --options are required")

    from mlxbun_cli.server import handoff
    from mlxbun_cli.server.run import engine_server

    options = ServeOptions(**json.loads(args.options))
    state = ServerState(options, ModelRef(args.model_id, Path(args.model_path), args.source))
    state.start_loading()
    if os.path.exists(args.socket):
        os.unlink(args.socket)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(args.socket)
    sock.listen(1024)
    try:
        side = handoff.listen(args.socket)
    except OSError as exc:  # an optimisation only: streams then go through the parent
        print(f"mlxbun worker: no connection handoff ({exc})", file=sys.stderr)
        side = None
    try:
        engine_server(state).run(sockets=[sock])
    finally:
        sock.close()
        if side is not None:
            side.close()
        for path in (args.socket, handoff.side_path(args.socket)):
            if os.path.exists(path):
                os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
