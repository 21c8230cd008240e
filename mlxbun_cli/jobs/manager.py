"""The daemon's job queue: one runner thread, worker processes, cancel and resume.

Jobs run one at a time, oldest first. A dataset job runs in the runner
thread itself (it only makes HTTP calls to the daemon's own API); quantize
and finetune run in a worker process (`python -m mlxbun_cli.jobs.worker`),
which writes its own events and final state to the store. Cancel asks the
job to stop (SIGTERM for a worker, then SIGKILL after a grace period); the
work done so far is kept, so a resumed job continues from it.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxbun_cli import paths
from mlxbun_cli.client.backend import Backend
from mlxbun_cli.errors import OptionError
from mlxbun_cli.jobs import ACTIVE_STATES
from mlxbun_cli.jobs.context import JobContext, execute
from mlxbun_cli.jobs.params import normalize
from mlxbun_cli.jobs.store import Job, JobStateError, JobStore

log = logging.getLogger("mlxbun.jobs")

WORKER_KINDS = ("quantize", "finetune")
BackendFactory = Callable[[JobContext], Backend]


def job_log_file(job_id: str) -> Path:
    return paths.log_dir() / "jobs" / f"{job_id}.log"


@dataclass
class _Running:
    job: Job
    ctx: JobContext | None = None
    proc: subprocess.Popen | None = None
    stop_sent_at: float | None = None

    def stop(self, cancel: bool) -> None:
        if self.ctx is not None:
            self.ctx.request_stop(cancel)
        if self.proc is not None and self.proc.poll() is None and self.stop_sent_at is None:
            self.stop_sent_at = time.monotonic()
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass


class JobManager:
    def __init__(
        self,
        store: JobStore,
        dataset_backend: BackendFactory | None = None,
        *,
        python: str = sys.executable,
        kill_grace: float = 10.0,
    ) -> None:
        self.store = store
        self._dataset_backend = dataset_backend
        self._python = python
        self._kill_grace = kill_grace
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._current: _Running | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> list[str]:
        """Mark what a dead daemon left running as interrupted; pick up queued jobs."""
        interrupted = self.store.mark_orphans_interrupted()
        for job_id in self.store.queued_ids():
            self._queue.put(job_id)
        self._thread = threading.Thread(target=self._loop, name="mlxbun-jobs", daemon=True)
        self._thread.start()
        return interrupted

    def interrupt(self) -> None:
        """The daemon is shutting down: stop the running job (resumable), start no other."""
        self._stopping.set()
        self._queue.put(None)
        with self._lock:
            running = self._current
        if running is not None:
            running.stop(cancel=False)

    def stop(self, timeout: float = 30.0) -> None:
        self.interrupt()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            running = self._current
        if running is not None and running.proc is not None and running.proc.poll() is None:
            running.proc.kill()  # it had its SIGTERM and the whole grace period

    # -- requests --------------------------------------------------------------------

    def submit(self, kind: Any, params: Any, base_dir: Path | None = None) -> Job:
        params, output = normalize(kind, params, base_dir)
        active = self.store.active_with_output(output)
        if active is not None:
            field = "params.output" if kind != "quantize" else "params.name"
            raise OptionError(field, f"job {active.id} ({active.state}) already writes {output}")
        job = self.store.create(kind, params, output)
        self._queue.put(job.id)
        return job

    def cancel(self, job_id: str) -> Job:
        job = self.store.request_cancel(job_id)
        with self._lock:
            running = self._current
        if running is not None and running.job.id == job_id:
            running.stop(cancel=True)
        return job

    def resume(self, job_id: str) -> Job:
        job = self.store.requeue(job_id)
        self._queue.put(job_id)
        return job

    def remove(self, job_id: str, outputs: bool = False) -> list[str]:
        """Forget a finished job; with `outputs`, delete what it wrote too."""
        job = self.store.require(job_id)
        if job.state in ACTIVE_STATES:
            raise JobStateError(f"job {job_id} is {job.state}; cancel it first")
        removed = remove_outputs(job) if outputs else []
        self.store.delete(job_id)
        return removed

    # -- the runner thread -----------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            job_id = self._queue.get()
            if job_id is None or self._stopping.is_set():
                return
            job = self.store.start_run(job_id, owner_pid=os.getpid())
            if job is None:
                continue  # cancelled while queued, or queued twice
            try:
                if job.kind in WORKER_KINDS:
                    self._run_worker(job)
                else:
                    self._run_dataset(job)
            except Exception as exc:  # the loop must survive any one job
                log.exception("job %s failed", job.id)
                self.store.finish(job.id, "failed", f"{type(exc).__name__}: {exc}", job.attempt)
            finally:
                with self._lock:
                    self._current = None

    def _run_dataset(self, job: Job) -> None:
        from mlxbun_cli.jobs import dataset

        ctx = JobContext(self.store, job)
        with self._lock:
            self._current = _Running(job, ctx=ctx)
        if self._stopping.is_set():
            ctx.request_stop(cancel=False)
        if self._dataset_backend is None:
            ctx.finish("failed", "this server cannot run dataset jobs (no backend)")
            return
        holder: list[Backend] = []

        def work(ctx: JobContext) -> None:
            holder.append(self._dataset_backend(ctx))  # type: ignore[misc]
            dataset.run(ctx, holder[0])

        try:
            execute(ctx, work)
        finally:
            for backend in holder:
                backend.close()

    def _run_worker(self, job: Job) -> None:
        log_path = paths.ensure(job_log_file(job.id).parent) / f"{job.id}.log"
        with open(log_path, "ab") as out:
            out.write(
                f"--- attempt {job.attempt} {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode()
            )
            out.flush()
            proc = subprocess.Popen(
                [self._python, "-m", "mlxbun_cli.jobs.worker", job.kind, job.id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "MLXBUN_JOB_ATTEMPT": str(job.attempt)},
                start_new_session=True,  # signals come from here, not the terminal
            )
        running = _Running(job, proc=proc)
        with self._lock:
            self._current = running
        self.store.set_owner(job.id, job.attempt, proc.pid)
        if self._stopping.is_set():
            running.stop(cancel=False)
        while proc.poll() is None:
            sent = running.stop_sent_at
            if sent is not None and time.monotonic() - sent > self._kill_grace:
                proc.kill()
            try:
                proc.wait(0.2)
            except subprocess.TimeoutExpired:
                pass
        self._settle(job, proc.returncode, running.stop_sent_at is not None, log_path)

    def _settle(self, job: Job, code: int, stop_sent: bool, log_path: Path) -> None:
        """A worker that exited without recording a final state (killed, crashed)."""
        current = self.store.get(job.id)
        if current is None or current.state != "running" or current.attempt != job.attempt:
            return
        if current.cancel_requested:
            state, error = "cancelled", None
        elif stop_sent:
            state, error = "interrupted", None
        else:
            how = f"signal {-code}" if code < 0 else f"code {code}"
            state, error = "failed", f"the worker exited with {how}; see {log_path}"
        self.store.finish(job.id, state, error, job.attempt)


def remove_outputs(job: Job) -> list[str]:
    """What the job wrote: the results (+ errors) file, the model dir or the adapter dir."""
    if not job.output:
        return []
    output = Path(job.output)
    targets = [output]
    if job.kind == "dataset":
        from mlxbun_cli.jobs.dataset import errors_path

        targets.append(errors_path(output))
    removed = []
    for target in targets:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            continue
        removed.append(str(target))
    return removed
