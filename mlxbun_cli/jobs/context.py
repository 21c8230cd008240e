"""What a runner sees of its job: params, a way to report, and whether to stop.

The same runner code runs in the daemon's runner thread, in a worker process
and in the CLI's own process; only how a stop is asked for differs (a manager
sets `stop`, a worker's signal handler sets it, Ctrl-C sets it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mlxbun_cli.errors import MlxbunError
from mlxbun_cli.jobs.store import Job, JobStore

log = logging.getLogger("mlxbun.jobs")

Listener = Callable[[str, dict[str, Any]], None]


class Stopped(BaseException):
    """Raised inside a runner when it was asked to stop; the work done so far is kept.

    A BaseException, like KeyboardInterrupt, so a library's `except Exception`
    between the raise and the runner cannot swallow it.
    """


class JobContext:
    PROGRESS_INTERVAL = 0.5  # seconds between progress rows written to the store

    def __init__(self, store: JobStore, job: Job, listener: Listener | None = None) -> None:
        self.store = store
        self.job = job
        self.listener = listener
        self.stop = threading.Event()
        self.cancel_requested = False  # set with `stop` when the user cancelled
        self._last_progress = 0.0
        self._pending: dict[str, Any] | None = None
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def params(self) -> dict[str, Any]:
        return self.job.params

    def request_stop(self, cancel: bool) -> None:
        self.cancel_requested = self.cancel_requested or cancel
        self.stop.set()

    def check_stop(self) -> None:
        if self.stop.is_set():
            raise Stopped()

    def event(self, type: str, **data: Any) -> None:
        self.store.add_event(self.id, type, data)
        if self.listener is not None:
            self.listener(type, data)

    def log(self, message: str, **data: Any) -> None:
        self.event("log", message=message, **data)

    def progress(self, data: dict[str, Any], force: bool = False) -> None:
        """Progress for watchers; written to the store at most every half second."""
        if self.listener is not None:
            self.listener("progress", data)
        with self._lock:
            self._pending = data
        self.flush_progress(force)

    def flush_progress(self, force: bool = False) -> None:
        """Write the latest progress if the interval has passed (or `force`)."""
        now = time.monotonic()
        with self._lock:
            data = self._pending
            if data is None or (not force and now - self._last_progress < self.PROGRESS_INTERVAL):
                return
            self._last_progress, self._pending = now, None
        self.store.set_progress(self.id, data, attempt=self.job.attempt)

    def stop_state(self) -> str:
        """The final state of a run that stopped before finishing."""
        if self.cancel_requested:
            return "cancelled"
        current = self.store.get(self.id)
        return "cancelled" if current is not None and current.cancel_requested else "interrupted"

    def finish(self, state: str, error: str | None = None) -> bool:
        done = self.store.finish(self.id, state, error, attempt=self.job.attempt)
        if self.listener is not None:
            self.listener("state", {"state": state, **({"error": error} if error else {})})
        return done


def execute(ctx: JobContext, work: Callable[[JobContext], Any]) -> str:
    """Run `work` and record how it ended: succeeded, failed, cancelled or interrupted."""
    try:
        work(ctx)
    except Stopped:
        state, error = ctx.stop_state(), None
    except MlxbunError as exc:
        state, error = "failed", exc.message
    except KeyboardInterrupt:
        ctx.request_stop(cancel=False)
        ctx.finish("interrupted")
        raise
    except Exception as exc:  # a runner bug must still end the job, with a reason
        log.exception("job %s failed", ctx.id)
        state, error = "failed", f"{type(exc).__name__}: {exc}"
    else:
        state, error = "succeeded", None  # a runner stopped early raises Stopped
    ctx.finish(state, error)
    return state
