"""The background daemon's lifecycle: its state file, its lock, start, stop, logs.

A serving process holds an flock on `daemon.lock` for its whole life, so two
servers cannot share a state dir by accident, and writes `daemon.json` (pid,
url, model, started_at, log) that clients read to find it. A state file whose
pid is dead is stale: it is removed when read.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from mlxbun_cli import paths
from mlxbun_cli.errors import BackendUnavailableError, MlxbunError


@dataclass(frozen=True)
class DaemonInfo:
    pid: int
    url: str
    model: str
    started_at: float
    log: str
    api_key_set: bool = False

    @property
    def uptime_s(self) -> float:
        return time.time() - self.started_at


def state_file() -> Path:
    return paths.state_dir() / "daemon.json"


def lock_file() -> Path:
    return paths.state_dir() / "daemon.lock"


def log_file() -> Path:
    return paths.log_dir() / "daemon.log"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (ours, not yet reaped) is not serving.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def read_state(clean_stale: bool = True) -> DaemonInfo | None:
    path = state_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        info = DaemonInfo(**{k: data[k] for k in DaemonInfo.__dataclass_fields__ if k in data})
    except (OSError, ValueError, TypeError):
        return None
    if not pid_alive(info.pid):
        if clean_stale:
            path.unlink(missing_ok=True)
        return None
    return info


def write_state(info: DaemonInfo) -> None:
    path = paths.ensure(paths.state_dir()) / "daemon.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2), encoding="utf-8")
    tmp.replace(path)


def clear_state(pid: int) -> None:
    info = read_state(clean_stale=False)
    if info is not None and info.pid == pid:
        state_file().unlink(missing_ok=True)


class DaemonLock:
    """Held by the serving process for its life; the OS releases it if we die."""

    def __init__(self) -> None:
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        import fcntl

        paths.ensure(paths.state_dir())
        fh = open(lock_file(), "a+")  # noqa: SIM115 - held open for the process's life
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            running = read_state()
            where = f" (pid {running.pid}, {running.url})" if running else ""
            raise MlxbunError(
                f"an mlxbun server is already running on this state dir{where}",
                hint="stop it with `mlxbun daemon stop`, or set MLXBUN_HOME to run another",
            ) from None
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def health(url: str, api_key: str | None = None, timeout: float = 2.0) -> dict[str, Any] | None:
    import httpx

    try:
        response = httpx.get(f"{url}/health", timeout=timeout)
        return {"status_code": response.status_code, **response.json()}
    except (httpx.HTTPError, ValueError):
        return None


def log_tail(lines: int = 20) -> str:
    try:
        text = log_file().read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def start_detached(
    serve_args: list[str], timeout: float = 120.0, secrets: dict[str, str] | None = None
) -> DaemonInfo:
    """Start `mlxbun serve` in a new session, logging to the log dir; wait for /health."""
    running = read_state()
    if running is not None:
        raise MlxbunError(
            f"a daemon is already running (pid {running.pid}, {running.url})",
            hint="`mlxbun daemon stop` first, or `mlxbun daemon status` to see it",
        )
    log_path = paths.ensure(paths.log_dir()) / "daemon.log"
    with open(log_path, "ab") as log:
        log.write(
            f"\n--- mlxbun daemon starting {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode()
        )
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlxbun_cli", "serve", *serve_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            env={**os.environ, **(secrets or {})},  # secrets by env, never in argv
        )
    deadline = time.time() + timeout
    while time.time() < deadline:
        code = proc.poll()
        if code is not None:
            raise MlxbunError(
                f"the daemon exited during start-up (exit code {code})",
                hint=f"last lines of {log_path}:\n{log_tail(8)}",
            )
        info = read_state()
        if info is not None and info.pid == proc.pid:
            status = health(info.url)
            if status is not None and status.get("status") == "ok":
                return info
            if status is not None and status.get("status") in ("error", "failed"):
                stop(timeout=10)
                raise MlxbunError(f"the daemon could not load its model: {status.get('error')}")
        time.sleep(0.1)
    raise MlxbunError(
        f"the daemon did not become healthy within {timeout:.0f}s (pid {proc.pid}); it keeps starting",
        hint=f"`mlxbun daemon logs` shows {log_path}",
    )


@dataclass(frozen=True)
class StopResult:
    pid: int
    how: str  # "stopped", "killed", "not-running"
    seconds: float


def stop(timeout: float = 15.0) -> StopResult:
    info = read_state()
    if info is None:
        return StopResult(0, "not-running", 0.0)
    started = time.time()
    try:
        os.kill(info.pid, signal.SIGTERM)
    except ProcessLookupError:
        return StopResult(info.pid, "stopped", 0.0)
    while time.time() - started < timeout:
        if not pid_alive(info.pid):
            clear_state(info.pid)
            return StopResult(info.pid, "stopped", time.time() - started)
        time.sleep(0.05)
    try:
        os.kill(info.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(0.2)
    state_file().unlink(missing_ok=True)
    return StopResult(info.pid, "killed", time.time() - started)


def find_running() -> DaemonInfo | None:
    """A daemon that answers /health, or None."""
    info = read_state()
    if info is None:
        return None
    status = health(info.url, timeout=1.0)
    return info if status is not None else None


def require_running() -> DaemonInfo:
    info = read_state()
    if info is None:
        raise BackendUnavailableError(
            "no mlxbun daemon is running", hint="start one with `mlxbun serve -d`"
        )
    return info
