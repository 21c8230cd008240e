"""`python -m mlxbun_cli.jobs.worker KIND JOB_ID`: one quantize or finetune run.

The manager has already marked the job running (attempt N, in the
environment as MLXBUN_JOB_ATTEMPT); this process reads the params from the
store, writes its events, progress and final state there itself, and exits
0 (succeeded), 1 (failed) or 3 (stopped: cancelled or interrupted).

SIGTERM or SIGINT asks it to stop: a fine-tune writes a checkpoint at the
next step, a quantize is interrupted at once and leaves nothing behind. If
the daemon that started it dies, it stops the same way, as interrupted.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from types import ModuleType
from typing import Any

from mlxbun_cli.jobs.context import JobContext, Stopped, execute
from mlxbun_cli.jobs.store import JobStore

EXIT_CODES = {"succeeded": 0, "failed": 1}
EXIT_STOPPED = 3
EXIT_NOT_OURS = 4


def _runner(kind: str) -> ModuleType:
    if kind == "quantize":
        from mlxbun_cli.jobs import quantize

        return quantize
    if kind == "finetune":
        from mlxbun_cli.jobs import finetune

        return finetune
    raise SystemExit(f"unknown worker kind {kind!r}")


def _install_stop(ctx: JobContext, interruptible: bool) -> None:
    def on_signal(signum: int, frame: Any) -> None:
        first = not ctx.stop.is_set()
        ctx.request_stop(cancel=False)  # cancelled or interrupted: the store says which
        if interruptible and first:
            raise Stopped()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _watch_parent() -> None:
    """The daemon died (kill -9): stop as if it had asked, so the job ends interrupted."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="mlxbun-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m mlxbun_cli.jobs.worker KIND JOB_ID", file=sys.stderr)
        return 2
    kind, job_id = args
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = JobStore()
    job = store.require(job_id)
    attempt = int(os.environ.get("MLXBUN_JOB_ATTEMPT", job.attempt))
    if job.state != "running" or job.attempt != attempt or job.kind != kind:
        print(f"job {job_id} is not this worker's to run ({job.state})", file=sys.stderr)
        return EXIT_NOT_OURS
    runner = _runner(kind)
    ctx = JobContext(store, job)
    _install_stop(ctx, runner.INTERRUPTIBLE)
    _watch_parent()
    state = execute(ctx, runner.run)
    return EXIT_CODES.get(state, EXIT_STOPPED)


if __name__ == "__main__":
    sys.exit(main())
