"""`generate --batch`: a dataset job in this process, or in the daemon when one runs.

The rule is open_backend's: the daemon when it runs and serves the model
asked for (and no adapter is asked for), this process otherwise. Either
way the job is in the store, its events reach `listener` as they happen,
and Ctrl-C stops it cleanly: what is written stays, a rerun resumes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxbun_cli.config import Settings
from mlxbun_cli.errors import InputError, MlxbunError
from mlxbun_cli.jobs.dataset import DEFAULT_CONCURRENCY

Listener = Callable[[str, dict[str, Any]], None]


@dataclass
class BatchResult:
    job_id: str
    state: str  # succeeded | failed | cancelled | interrupted
    where: str  # "in process" or the daemon's URL
    output: str
    errors_file: str
    progress: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def request_defaults(fields: dict[str, Any]) -> dict[str, Any]:
    """GenerationRequest keyword arguments from CLI flags → OpenAI body fields."""
    out = {k: v for k, v in fields.items() if v not in (None, [], {})}
    if "logit_bias" in out:
        out["logit_bias"] = {str(k): v for k, v in out["logit_bias"].items()}
    return out


def run_batch(
    input_path: str,
    output: str | None,
    *,
    model: str | None,
    defaults: dict[str, Any],
    concurrency: int = DEFAULT_CONCURRENCY,
    adapter: str | None = None,
    local: bool = False,
    remote: str | None = None,
    listener: Listener | None = None,
    settings: Settings | None = None,
) -> BatchResult:
    settings = settings or Settings()
    if local and remote:
        raise InputError("--local and --remote cannot be used together")
    params: dict[str, Any] = {"input": input_path, "concurrency": concurrency, "defaults": defaults}
    if output:
        params["output"] = output
    if not local and adapter is None:
        client = _daemon_for(model, settings, remote)
        if client is not None:
            if model:
                params["model"] = model
            return _in_daemon(client, _absolute(params), listener)
    return _in_process(params, model, adapter, settings, listener)


def _absolute(params: dict[str, Any]) -> dict[str, Any]:
    """The daemon's working directory is not ours: send absolute paths."""
    out = dict(params)
    for key in ("input", "output"):
        if out.get(key):
            out[key] = str(Path(out[key]).expanduser().resolve())
    return out


def _daemon_for(model: str | None, settings: Settings, remote: str | None) -> Any:
    from mlxbun_cli.jobs.client import DaemonJobs

    if remote:
        return DaemonJobs(remote, settings.api_key)
    from mlxbun_cli.client import daemon
    from mlxbun_cli.services.generate import _same_model

    running = daemon.find_running()
    if running is None or not _same_model(model, settings.default_model, running.model):
        return None
    client = DaemonJobs(running.url, settings.api_key)
    if not client.runs_jobs():  # a daemon without the job routes: run here instead
        client.close()
        return None
    return client


def _in_daemon(client: Any, params: dict[str, Any], listener: Listener | None) -> BatchResult:
    try:
        job = client.submit("dataset", params)
        end = _follow(client, job["id"], listener)
    finally:
        client.close()
    job = end.get("job") or job
    return _result(job, client.url)


def _follow(client: Any, job_id: str, listener: Listener | None) -> dict[str, Any]:
    """Relay the job's events until it ends; Ctrl-C cancels it and waits for the end."""
    cancelled = False
    while True:
        try:
            for kind, event in client.events(job_id, follow=True):
                if kind == "end":
                    return event
                if listener is not None:
                    listener(kind, event.get("data") or {})
            return {"job": client.get(job_id)}
        except KeyboardInterrupt:
            if cancelled:
                raise
            cancelled = True
            client.cancel(job_id)  # a foreground batch stops with Ctrl-C; a rerun resumes


def _in_process(
    params: dict[str, Any],
    model: str | None,
    adapter: str | None,
    settings: Settings,
    listener: Listener | None,
) -> BatchResult:
    from mlxbun_cli.jobs import dataset
    from mlxbun_cli.jobs.context import JobContext, execute
    from mlxbun_cli.jobs.params import normalize
    from mlxbun_cli.jobs.store import JobStore
    from mlxbun_cli.services.generate import local_backend

    params, out_path = normalize("dataset", params)
    store = JobStore()
    store.mark_orphans_interrupted()  # a batch killed earlier no longer holds its output
    active = store.active_with_output(out_path)
    if active is not None:
        raise InputError(
            f"job {active.id} ({active.state}) already writes {out_path}",
            hint=f"`mlxbun jobs watch {active.id}` follows it",
        )
    backend = local_backend(model, adapter, settings, deferred_output=True)
    params["model"] = backend.ref.id
    job = store.create("dataset", params, out_path)
    started = store.start_run(job.id, owner_pid=os.getpid())
    assert started is not None
    ctx = JobContext(store, started, listener)

    def work(ctx: JobContext) -> None:
        # Start the scheduler from one thread: LoadedModel.scheduler is created lazily,
        # and N threads racing to be first would each start one.
        _ = backend.loaded.scheduler
        dataset.run(ctx, backend)

    try:
        execute(ctx, work)
    except KeyboardInterrupt:
        pass  # recorded as interrupted; what was written stays
    finally:
        backend.close()
    return _result(store.require(job.id).as_dict(), "in process")


def _result(job: dict[str, Any], where: str) -> BatchResult:
    from mlxbun_cli.jobs.dataset import errors_path

    output = job.get("output") or job["params"].get("output", "")
    result = BatchResult(
        job_id=job["id"],
        state=job["state"],
        where=where,
        output=output,
        errors_file=str(errors_path(Path(output))),
        progress=job.get("progress") or {},
        error=job.get("error"),
    )
    if result.state == "failed":
        raise MlxbunError(result.error or "the batch failed", hint=f"job {result.job_id}")
    return result
