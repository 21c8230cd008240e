"""The CLI's side of jobs: the daemon's HTTP API, or the store when no daemon runs.

`DaemonJobs` speaks /api/jobs over httpx; `StoreJobs` reads (and prunes) the
SQLite store directly, for `jobs list/show/logs/rm` while no daemon runs.
Both hand back plain job dicts, the shape the API answers with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from mlxbun_cli.errors import BackendUnavailableError, InputError, MlxbunError

NO_DAEMON_HINT = "start one with `mlxbun serve -d`"


class DaemonJobs:
    def __init__(
        self, url: str, api_key: str | None = None, transport: Any = None, timeout: float = 60.0
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=self.url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    def close(self) -> None:
        self.client.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        import httpx

        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BackendUnavailableError(
                f"the mlxbun daemon at {self.url} did not answer ({type(exc).__name__})",
                hint="`mlxbun daemon status` shows whether it runs",
            ) from exc
        return _checked(response)

    def list(
        self, limit: int = 50, kind: str | None = None, state: str | None = None
    ) -> list[dict[str, Any]]:
        query = {
            "limit": limit,
            **({"kind": kind} if kind else {}),
            **({"state": state} if state else {}),
        }
        return self._call("GET", "/api/jobs", params=query)["jobs"]

    def get(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job_id}")["job"]

    def submit(self, kind: str, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/api/jobs", json={"kind": kind, "params": params})["job"]

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/api/jobs/{job_id}/cancel")["job"]

    def resume(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/api/jobs/{job_id}/resume")["job"]

    def remove(self, job_id: str, outputs: bool = False) -> list[str]:
        query = {"outputs": "true"} if outputs else {}
        return self._call("DELETE", f"/api/jobs/{job_id}", params=query)["removed"]

    def events(self, job_id: str, follow: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, event) pairs: every past event, then live ones until the job ends.

        Without `follow` it stops after the past ones. The last pair of a
        followed stream is ("end", {"job": …, "reason": …}).
        """
        if follow:
            yield from self._stream(job_id)
            return
        after = 0
        while True:
            query = {"after": after, "limit": 1000}
            batch = self._call("GET", f"/api/jobs/{job_id}/events", params=query)["events"]
            for event in batch:
                yield event["type"], event
                after = event["seq"]
            if len(batch) < 1000:
                return

    def runs_jobs(self) -> bool:
        """Whether this server has the job routes (a model worker or an old server has not)."""
        import httpx

        try:
            response = self.client.get("/api/jobs", params={"limit": 0}, timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code in (200, 401)

    def _stream(self, job_id: str, after: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
        import httpx

        try:
            with self.client.stream(
                "GET",
                f"/api/jobs/{job_id}/stream",
                params={"after": after},
                timeout=httpx.Timeout(60.0, connect=5.0),
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _checked(response)
                yield from parse_sse(response.iter_lines())
        except httpx.HTTPError as exc:
            raise BackendUnavailableError(
                f"the job stream from {self.url} broke off ({type(exc).__name__})",
                hint="the job goes on in the daemon; `mlxbun jobs watch` reattaches",
            ) from exc


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Server-sent events → (event type, decoded data); comments are skipped."""
    kind, data = "message", []
    for line in lines:
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    if data:
        yield kind, json.loads("\n".join(data))


def _checked(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code < 400 and isinstance(body, dict) and body.get("ok"):
        return body
    message = (body.get("error") if isinstance(body, dict) else None) or response.text
    if isinstance(message, dict):  # an error in another wire's shape
        message = message.get("message") or json.dumps(message)
    status = response.status_code
    if status == 401:
        raise InputError(
            f"the daemon refused the API key: {message}",
            hint="set MLXBUN_API_KEY or `mlxbun config set api_key KEY`",
        )
    if status == 503:
        raise BackendUnavailableError(
            f"the daemon does not run jobs: {message}",
            hint="restart it with a version of mlxbun that does (`mlxbun serve -d`)",
        )
    if status == 404 and "job" in str(message):
        raise InputError(str(message), hint="`mlxbun jobs list` shows the jobs")
    if 400 <= status < 500:
        raise InputError(str(message))
    raise MlxbunError(f"the daemon answered {status}: {message}")


class StoreJobs:
    """The store itself, while no daemon runs (it cannot start or stop work)."""

    def __init__(self) -> None:
        from mlxbun_cli.jobs.store import JobStore

        self.store = JobStore()
        self.store.mark_orphans_interrupted()  # no daemon: nothing of its is still running

    def close(self) -> None:
        pass

    def list(
        self, limit: int = 50, kind: str | None = None, state: str | None = None
    ) -> list[dict[str, Any]]:
        return [job.as_dict() for job in self.store.recent(limit, kind, state)]

    def get(self, job_id: str) -> dict[str, Any]:
        return self.store.resolve(job_id).as_dict()

    def remove(self, job_id: str, outputs: bool = False) -> list[str]:
        from mlxbun_cli.jobs.manager import remove_outputs
        from mlxbun_cli.jobs.store import JobStateError

        job = self.store.resolve(job_id)
        if job.state in ("queued", "running"):
            raise JobStateError(f"job {job.id} is {job.state}; cancel it first")
        removed = remove_outputs(job) if outputs else []
        self.store.delete(job.id)
        return removed

    def events(self, job_id: str, follow: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
        """Past events; with `follow`, new ones too (polled) until the job ends.

        Only an in-process `generate --batch` in another terminal moves a job
        while no daemon runs; anything else is already over.
        """
        import time

        job = self.store.resolve(job_id)
        after = 0
        while True:
            batch = self.store.events(job.id, after, 1000)
            for event in batch:
                yield event.type, event.as_dict()
                after = event.seq
            if len(batch) == 1000:
                continue
            if not follow:
                return
            current = self.store.get(job.id)
            if current is None or current.finished:
                if not self.store.events(job.id, after, 1):
                    job_dict = current.as_dict() if current else None
                    yield "end", {"job": job_dict, "reason": "finished"}
                    return
                continue
            time.sleep(0.2)


def daemon_jobs(remote: str | None = None) -> DaemonJobs | None:
    """The running daemon's job API (or the server at `remote`); None when none runs one."""
    from mlxbun_cli.config import Settings

    api_key = Settings().api_key
    if remote:
        return DaemonJobs(remote, api_key)
    from mlxbun_cli.client import daemon

    running = daemon.find_running()
    if running is None:
        return None
    client = DaemonJobs(running.url, api_key)
    if not client.runs_jobs():
        client.close()
        return None
    return client


def require_daemon(remote: str | None = None) -> DaemonJobs:
    client = daemon_jobs(remote)
    if client is not None:
        return client
    from mlxbun_cli.client import daemon

    if daemon.find_running() is not None:
        raise BackendUnavailableError(
            "the running mlxbun server does not answer the jobs API",
            hint="is it an mlxbun daemon of this version? `mlxbun daemon status` shows it",
        )
    raise BackendUnavailableError("no mlxbun daemon is running", hint=NO_DAEMON_HINT)


def jobs_api(remote: str | None = None) -> DaemonJobs | StoreJobs:
    """The daemon when one runs, the store otherwise (reads only)."""
    return daemon_jobs(remote) or StoreJobs()
