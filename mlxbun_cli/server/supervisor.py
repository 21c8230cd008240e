"""Worker processes: spawn, health-check, respawn with backoff, record how they exited.

Like uvicorn's supervisors: a worker that dies unexpectedly is restarted after
a growing delay; one that cannot load its model is marked failed, not looped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from mlxbun_cli.catalog import ModelRef
from mlxbun_cli.server import handoff
from mlxbun_cli.server.state import ServeOptions

log = logging.getLogger("mlxbun.supervisor")

BACKOFF_START = 0.1  # then 0.2, 0.4, … up to BACKOFF_MAX while it keeps crashing
BACKOFF_MAX = 10.0
WATCH_INTERVAL_S = 0.025  # how soon a dead worker is noticed (a poll() per worker)


class EngineUnavailable(Exception):
    """The worker cannot take a request now; the message says why."""


def describe_exit(code: int | None) -> dict[str, Any] | None:
    if code is None:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return {"signal": name, "code": None}
    return {"signal": None, "code": code}


@dataclass
class Worker:
    ref: ModelRef
    adapter: str | None
    socket_path: str
    estimated_bytes: int
    state: str = "starting"  # starting | ready | restarting | failed | stopping | stopped
    proc: subprocess.Popen | None = None
    restarts: int = 0
    last_exit: dict[str, Any] | None = None
    last_error: str | None = None
    started_at: float = 0.0
    ready_at: float = 0.0
    leases: int = 0
    last_used: float = field(default_factory=time.time)
    pinned: bool = False
    keep_alive: float | None = None
    memory_ceiling: int | None = None
    client: Any = None
    ready_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.ref.id,
            "pid": self.pid,
            "state": self.state,
            "restarts": self.restarts,
            "socket": self.socket_path,
            "last_exit": self.last_exit,
            "last_error": self.last_error,
            "leases": self.leases,
            "pinned": self.pinned,
            "estimated_bytes": self.estimated_bytes,
            "last_used": self.last_used,
            "idle_s": round(time.time() - self.last_used, 1),
            "uptime_s": round(time.time() - self.started_at, 1) if self.started_at else 0.0,
            "keep_alive_s": self.keep_alive,
            "memory_ceiling": self.memory_ceiling,
        }


class Supervisor:
    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.socket_dir = tempfile.mkdtemp(
            prefix="mlxbun-w-"
        )  # short: AF_UNIX paths are ≤ 107 bytes
        self.workers: dict[str, Worker] = {}
        self._monitor: asyncio.Task | None = None
        self._stopping = False
        self._spawned = 0
        # ref id -> (socket path, process, adapter, memory ceiling) started early
        self._prestarted: dict[str, tuple[str, subprocess.Popen, str | None, int | None]] = {}
        # A spare worker with everything imported, waiting on stdin for its
        # model: a respawn or a newly loaded model then skips ~1.5 s of start-up.
        self.standby: subprocess.Popen | None = None

    # -- lifecycle ---------------------------------------------------------------

    def _socket_path(self) -> str:
        self._spawned += 1
        return os.path.join(self.socket_dir, f"w{self._spawned}.sock")

    def _popen(
        self, ref: ModelRef, socket_path: str, adapter: str | None, memory_ceiling: int | None
    ) -> subprocess.Popen:
        from mlxbun_cli.server.worker import COMMAND, worker_args

        args = worker_args(self.options, ref, socket_path, adapter, memory_ceiling)
        spare, self.standby = self.standby, None
        if spare is not None and spare.poll() is None:
            try:
                spare.stdin.write((json.dumps(args) + "\n").encode())
                spare.stdin.close()
                return spare
            except OSError:  # it died meanwhile: start one the usual way
                spare.kill()
        return subprocess.Popen([*COMMAND, *args], stdin=subprocess.DEVNULL, start_new_session=True)

    def ensure_standby(self) -> None:
        """Start a spare worker if the options want one and none is waiting."""
        if not self.options.standby or self._stopping:
            return
        if self.standby is not None and self.standby.poll() is None:
            return
        from mlxbun_cli.server.worker import standby_args

        self.standby = subprocess.Popen(
            standby_args(), stdin=subprocess.PIPE, start_new_session=True
        )

    def prestart(self, ref: ModelRef, adapter: str | None, memory_ceiling: int | None) -> None:
        """Start a worker process with no event loop yet; new_worker adopts it."""
        path = self._socket_path()
        self._prestarted[ref.id] = (
            path,
            self._popen(ref, path, adapter, memory_ceiling),
            adapter,
            memory_ceiling,
        )

    def new_worker(
        self,
        ref: ModelRef,
        estimated_bytes: int,
        adapter: str | None = None,
        memory_ceiling: int | None = None,
    ) -> Worker:
        early = self._prestarted.pop(ref.id, None)
        if early is not None and early[2:] != (adapter, memory_ceiling):
            early[1].kill()  # started with other settings: not the worker asked for now
            early[1].wait()
            early = None
        worker = Worker(
            ref,
            adapter,
            early[0] if early else self._socket_path(),
            estimated_bytes,
            memory_ceiling=memory_ceiling,
        )
        self.workers[ref.id] = worker
        self._spawn(worker, early[1] if early else None)
        if self._monitor is None:
            self._monitor = asyncio.get_running_loop().create_task(self._watch())
        return worker

    def _spawn(self, worker: Worker, proc: subprocess.Popen | None = None) -> None:
        import httpx

        worker.state = "starting"
        worker.ready_event = asyncio.Event()
        worker.started_at = time.time()
        worker.proc = proc or self._popen(
            worker.ref, worker.socket_path, worker.adapter, worker.memory_ceiling
        )
        if worker.client is None:
            worker.client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=worker.socket_path),
                base_url="http://mlxbun-worker",
                timeout=httpx.Timeout(None, connect=5.0),
            )
        asyncio.get_running_loop().create_task(self._await_ready(worker, worker.proc))

    async def _await_ready(self, worker: Worker, proc: subprocess.Popen) -> None:
        while worker.proc is proc and proc.poll() is None and not self._stopping:
            try:
                response = await worker.client.get("/health", timeout=2.0)
                status = response.json().get("status")
                if status == "ok":
                    worker.state, worker.ready_at = "ready", time.time()
                    worker.last_error = None
                    worker.ready_event.set()
                    log.info("worker for %s ready (pid %s)", worker.ref.id, proc.pid)
                    # Only now: a spare importing alongside would slow this start.
                    self.ensure_standby()
                    return
                if status == "error":
                    worker.last_error = response.json().get("error")
                    worker.state = "failed"
                    worker.ready_event.set()
                    await self._terminate(worker)
                    return
            except Exception:
                pass
            await asyncio.sleep(0.02)

    async def _watch(self) -> None:
        """Respawn workers that died without being asked to."""
        while not self._stopping:
            for worker in list(self.workers.values()):
                proc = worker.proc
                if proc is None or worker.state in ("stopping", "stopped", "failed", "restarting"):
                    continue
                code = proc.poll()
                if code is None:
                    continue
                worker.last_exit = describe_exit(code)
                worker.restarts += 1
                worker.state = "restarting"
                worker.ready_event = asyncio.Event()
                delay = min(BACKOFF_MAX, BACKOFF_START * 2 ** min(worker.restarts - 1, 6))
                log.warning(
                    "worker for %s exited (%s); restarting in %.2fs",
                    worker.ref.id,
                    worker.last_exit,
                    delay,
                )
                asyncio.get_running_loop().create_task(self._respawn_later(worker, delay))
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def _respawn_later(self, worker: Worker, delay: float) -> None:
        await asyncio.sleep(delay)
        if (
            not self._stopping
            and worker.state == "restarting"
            and self.workers.get(worker.ref.id) is worker
        ):
            self._spawn(worker)

    async def wait_ready(self, worker: Worker, timeout: float = 300.0) -> None:
        if worker.state == "ready":
            return
        if worker.state == "failed":
            raise EngineUnavailable(f"model {worker.ref.id} failed to load: {worker.last_error}")
        if worker.state == "restarting":
            raise EngineUnavailable(f"the worker for {worker.ref.id} is restarting — retry shortly")
        try:
            await asyncio.wait_for(worker.ready_event.wait(), timeout)
        except asyncio.TimeoutError:
            raise EngineUnavailable(f"the worker for {worker.ref.id} is still starting") from None
        if worker.state != "ready":
            raise EngineUnavailable(
                f"model {worker.ref.id} failed to load: {worker.last_error or worker.state}"
            )

    async def _terminate(self, worker: Worker, timeout: float | None = None) -> None:
        proc = worker.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.time() + (
            timeout if timeout is not None else self.options.shutdown_grace + 10
        )
        while proc.poll() is None and time.time() < deadline:
            await asyncio.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            await asyncio.sleep(0.05)
        worker.last_exit = describe_exit(proc.poll())

    async def stop_worker(self, worker: Worker) -> None:
        worker.state = "stopping"
        await self._terminate(worker)
        worker.state = "stopped"
        if worker.client is not None:
            await worker.client.aclose()
            worker.client = None
        handoff.forget(worker.socket_path)
        self.workers.pop(worker.ref.id, None)

    def signal_all(self, sig: int = signal.SIGTERM) -> None:
        """Start every worker draining (called from the parent's signal handler)."""
        for worker in self.workers.values():
            if worker.proc is not None and worker.proc.poll() is None:
                worker.state = "stopping"
                worker.proc.send_signal(sig)

    async def shutdown(self) -> None:
        self._stopping = True
        self._drop_standby()
        for worker in list(self.workers.values()):
            await self.stop_worker(worker)
        if self._monitor is not None:
            self._monitor.cancel()
        try:
            os.rmdir(self.socket_dir)
        except OSError:
            pass

    def _drop_standby(self) -> None:
        spare, self.standby = self.standby, None
        if spare is not None and spare.poll() is None:
            spare.kill()
            spare.wait()

    def kill_all_now(self) -> None:
        """Last resort at exit: no worker outlives the parent."""
        self._drop_standby()
        for _path, proc, _adapter, _ceiling in self._prestarted.values():
            if proc.poll() is None:
                proc.kill()
        for worker in self.workers.values():
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.kill()
