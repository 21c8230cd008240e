"""Starting a real `mlxbun serve` subprocess on a free loopback port."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, home: Path, log: Path) -> None:
        self.proc, self.url, self.home, self.log = proc, url, home, log

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_server(
    model: str | Path, home: Path, *args: str, env: dict | None = None, timeout: float = 60
) -> Server:
    home.mkdir(parents=True, exist_ok=True)
    log = home / "server-output.log"
    full_env = {**os.environ, "MLXBUN_HOME": str(home), **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlxbun_cli", "serve", str(model), "--port", "0", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO,
        )
    state = home / "state" / "daemon.json"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}:\n{log.read_text()}")
        try:
            info = json.loads(state.read_text())
            if info["pid"] == proc.pid:
                response = httpx.get(info["url"] + "/health", timeout=2)
                # 200 comes while the model loads too (requests wait): wait for ready.
                if response.status_code == 200 and response.json().get("ready"):
                    return Server(proc, info["url"], home, log)
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not become healthy:\n{log.read_text()}")


def worker_stats(server: Server) -> dict:
    """The engine-side /stats: the server's own, or (isolated mode) its current worker's."""
    stats = httpx.get(server.url + "/stats", timeout=5).json()
    if stats.get("mode") != "isolated":
        return stats
    current = stats["residency"]["current"]
    return stats["workers"][current] or {}


def wait_for(check, timeout: float = 30.0, every: float = 0.05):
    """Poll `check` until it returns something truthy (returned); fail after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not reached within {timeout}s")
