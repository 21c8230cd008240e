"""The job store: SQLite in WAL mode, shared by the daemon, its workers and the CLI.

Every process opens its own short-lived connection per operation, so threads
and worker processes write side by side (WAL lets readers run during a write;
writers wait on each other through the busy timeout). Transactions stay short:
one row update plus, usually, one event.

Schema changes are append-only named migrations, applied in order and
recorded in `migrations`; a released migration is never edited.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxbun_cli import paths
from mlxbun_cli.errors import InputError
from mlxbun_cli.jobs import RESUMABLE_STATES, TERMINAL_STATES

MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "0001_jobs",
        """
        CREATE TABLE jobs (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            params TEXT NOT NULL,
            state TEXT NOT NULL,
            progress TEXT NOT NULL DEFAULT '{}',
            output TEXT,
            error TEXT,
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL
        );
        CREATE INDEX jobs_by_created ON jobs (created_at);
        """,
    ),
    (
        "0002_events",
        """
        CREATE TABLE events (
            job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (job_id, seq)
        );
        """,
    ),
    (
        # Which run of a job a process owns: a stale worker cannot overwrite a newer run.
        "0003_job_runs",
        """
        ALTER TABLE jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN owner_pid INTEGER;
        ALTER TABLE jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
        """,
    ),
)


class JobNotFoundError(InputError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job '{job_id}'", hint="`mlxbun jobs list` shows the jobs")
        self.job_id = job_id


class JobStateError(InputError):
    """An action the job's current state does not allow (cancel a finished job…)."""


@dataclass
class Job:
    id: str
    kind: str
    params: dict[str, Any]
    state: str
    progress: dict[str, Any] = field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int = 0
    owner_pid: int | None = None
    cancel_requested: bool = False

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "state": self.state,
            "params": self.params,
            "progress": self.progress,
            "output": self.output,
            "error": self.error,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "attempt": self.attempt,
            "cancel_requested": self.cancel_requested,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Event:
    job_id: str
    seq: int
    ts: float
    type: str
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "data": self.data,
        }


def default_path() -> Path:
    return paths.data_dir() / "jobs.db"


def new_job_id() -> str:
    return "job_" + secrets.token_hex(6)


def _job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        kind=row["kind"],
        params=json.loads(row["params"]),
        state=row["state"],
        progress=json.loads(row["progress"] or "{}"),
        output=row["output"],
        error=row["error"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        attempt=row["attempt"],
        owner_pid=row["owner_pid"],
        cancel_requested=bool(row["cancel_requested"]),
    )


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _pid_alive(pid: int) -> bool:
    from mlxbun_cli.client.daemon import pid_alive

    return pid_alive(pid)


class JobStore:
    def __init__(self, path: Path | str | None = None, *, migrate: bool = True) -> None:
        self.path = Path(path) if path is not None else default_path()
        if migrate:
            self.migrate()

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """One short-lived connection; a transaction that commits or rolls back."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    # -- schema ----------------------------------------------------------------

    def migrate(self, upto: int | None = None) -> list[str]:
        """Apply the migrations not yet recorded, in order; returns their names."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")  # persistent: set once per file
            conn.execute("BEGIN IMMEDIATE")  # two processes starting at once migrate once
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS migrations "
                    "(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
                )
                done = {r[0] for r in conn.execute("SELECT name FROM migrations")}
                applied = []
                for name, sql in MIGRATIONS[:upto]:
                    if name in done:
                        continue
                    for statement in sql.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(
                        "INSERT INTO migrations (name, applied_at) VALUES (?, ?)",
                        (name, time.time()),
                    )
                    applied.append(name)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
        return applied

    def applied_migrations(self) -> list[str]:
        with self.connect() as conn:
            rows = conn.execute("SELECT name FROM migrations ORDER BY name").fetchall()
        return [r[0] for r in rows]

    # -- jobs --------------------------------------------------------------------

    def create(self, kind: str, params: dict[str, Any], output: str | None = None) -> Job:
        """A new job, queued; its state is in the store before any work starts."""
        job_id, now = new_job_id(), time.time()
        with self.connect() as conn:
            conn.execute(
                "INSERT INTO jobs (id, kind, params, state, output, created_at) "
                "VALUES (?, ?, ?, 'queued', ?, ?)",
                (job_id, kind, _dumps(params), output, now),
            )
            self._event(conn, job_id, "state", {"state": "queued"}, now)
        return self.require(job_id)

    def get(self, job_id: str) -> Job | None:
        with self.connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def require(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        return job

    def resolve(self, id_or_prefix: str) -> Job:
        """A job by id or by a unique prefix of one (`job_3f` or `3f`)."""
        job = self.get(id_or_prefix)
        if job is not None:
            return job
        prefix = id_or_prefix if id_or_prefix.startswith("job_") else "job_" + id_or_prefix
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT * FROM jobs WHERE id LIKE ? ESCAPE '\\' LIMIT 2",
                (prefix.replace("_", "\\_") + "%",),
            ).fetchall()
        if len(rows) == 1:
            return _job(rows[0])
        if rows:
            raise InputError(f"'{id_or_prefix}' matches more than one job; give more of the id")
        raise JobNotFoundError(id_or_prefix)

    def recent(
        self, limit: int = 50, kind: str | None = None, state: str | None = None
    ) -> list[Job]:
        sql, args = "SELECT * FROM jobs WHERE 1 = 1", []
        if kind:
            sql += " AND kind = ?"
            args.append(kind)
        if state:
            sql += " AND state = ?"
            args.append(state)
        sql += " ORDER BY created_at DESC LIMIT ?"
        args.append(max(0, int(limit)))
        with self.connect() as conn:
            return [_job(r) for r in conn.execute(sql, args).fetchall()]

    def queued_ids(self) -> list[str]:
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT id FROM jobs WHERE state = 'queued' ORDER BY created_at"
            ).fetchall()
        return [r[0] for r in rows]

    def active_with_output(self, output: str) -> Job | None:
        """A queued or running job that writes `output`."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT * FROM jobs WHERE output = ? AND state IN ('queued', 'running') LIMIT 1",
                (output,),
            ).fetchone()
        return _job(row) if row else None

    def start_run(self, job_id: str, owner_pid: int | None = None) -> Job | None:
        """queued → running with a new attempt number; None when it is not queued."""
        now = time.time()
        with self.connect() as conn:
            changed = conn.execute(
                "UPDATE jobs SET state = 'running', attempt = attempt + 1, started_at = ?, "
                "finished_at = NULL, error = NULL, owner_pid = ?, cancel_requested = 0 "
                "WHERE id = ? AND state = 'queued'",
                (now, owner_pid or os.getpid(), job_id),
            ).rowcount
            if not changed:
                return None
            self._event(conn, job_id, "state", {"state": "running"}, now)
        return self.get(job_id)

    def set_owner(self, job_id: str, attempt: int, pid: int) -> None:
        with self.connect() as conn:
            conn.execute(
                "UPDATE jobs SET owner_pid = ? WHERE id = ? AND attempt = ? AND state = 'running'",
                (pid, job_id, attempt),
            )

    def finish(
        self,
        job_id: str,
        state: str,
        error: str | None = None,
        attempt: int | None = None,
        progress: dict[str, Any] | None = None,
    ) -> bool:
        """running → a final state; False when this run no longer owns the job."""
        assert state in TERMINAL_STATES, state
        now = time.time()
        sql = "UPDATE jobs SET state = ?, error = ?, finished_at = ?"
        args: list[Any] = [state, error, now]
        if progress is not None:
            sql += ", progress = ?"
            args.append(_dumps(progress))
        sql += " WHERE id = ? AND state = 'running'"
        args.append(job_id)
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        with self.connect() as conn:
            if not conn.execute(sql, args).rowcount:
                return False
            data: dict[str, Any] = {"state": state}
            if error:
                data["error"] = error
            self._event(conn, job_id, "state", data, now)
        return True

    def set_progress(
        self, job_id: str, progress: dict[str, Any], attempt: int | None = None, event: bool = True
    ) -> None:
        with self.connect() as conn:
            sql, args = "UPDATE jobs SET progress = ? WHERE id = ?", [_dumps(progress), job_id]
            if attempt is not None:
                sql += " AND attempt = ?"
                args.append(attempt)
            if conn.execute(sql, args).rowcount and event:
                self._event(conn, job_id, "progress", progress, time.time())

    def request_cancel(self, job_id: str) -> Job:
        """A queued job is cancelled at once; a running one is asked to stop."""
        now = time.time()
        with self.connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFoundError(job_id)
            job = _job(row)
            if job.state == "queued":
                conn.execute(
                    "UPDATE jobs SET state = 'cancelled', finished_at = ? WHERE id = ?",
                    (now, job_id),
                )
                self._event(conn, job_id, "state", {"state": "cancelled"}, now)
            elif job.state == "running":
                conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
                self._event(conn, job_id, "log", {"message": "cancel requested"}, now)
            else:
                raise JobStateError(f"job {job_id} is already {job.state}; nothing to cancel")
        return self.require(job_id)

    def requeue(self, job_id: str) -> Job:
        """interrupted / failed / cancelled → queued, to continue where it stopped."""
        now = time.time()
        with self.connect() as conn:
            row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFoundError(job_id)
            if row["state"] not in RESUMABLE_STATES:
                raise JobStateError(
                    f"job {job_id} is {row['state']}; only "
                    f"{', '.join(RESUMABLE_STATES)} jobs can be resumed"
                )
            conn.execute(
                "UPDATE jobs SET state = 'queued', error = NULL, finished_at = NULL, "
                "cancel_requested = 0 WHERE id = ?",
                (job_id,),
            )
            self._event(conn, job_id, "state", {"state": "queued", "resumed": True}, now)
        return self.require(job_id)

    def mark_orphans_interrupted(
        self, alive: Callable[[int], bool] = _pid_alive, reason: str | None = None
    ) -> list[str]:
        """Running jobs whose process is gone (a daemon killed mid-job) → interrupted."""
        me = os.getpid()
        with self.connect() as conn:
            rows = conn.execute("SELECT id, owner_pid FROM jobs WHERE state = 'running'").fetchall()
            gone = [
                r["id"]
                for r in rows
                if r["owner_pid"] is None or r["owner_pid"] == me or not alive(r["owner_pid"])
            ]
            now = time.time()
            message = reason or "the process running it stopped; `mlxbun jobs resume` continues it"
            for job_id in gone:
                conn.execute(
                    "UPDATE jobs SET state = 'interrupted', error = ?, finished_at = ? "
                    "WHERE id = ?",
                    (message, now, job_id),
                )
                self._event(conn, job_id, "state", {"state": "interrupted", "error": message}, now)
        return gone

    def delete(self, job_id: str) -> None:
        with self.connect() as conn:
            conn.execute("DELETE FROM events WHERE job_id = ?", (job_id,))
            conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    # -- events --------------------------------------------------------------------

    def add_event(self, job_id: str, type: str, data: dict[str, Any] | None = None) -> int:
        with self.connect() as conn:
            return self._event(conn, job_id, type, data or {}, time.time())

    def events(self, job_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT * FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (job_id, after, limit),
            ).fetchall()
        return [
            Event(r["job_id"], r["seq"], r["ts"], r["type"], json.loads(r["data"])) for r in rows
        ]

    @staticmethod
    def _event(
        conn: sqlite3.Connection, job_id: str, type: str, data: dict[str, Any], ts: float
    ) -> int:
        # Inside the caller's write transaction, so MAX(seq) + 1 cannot race.
        row = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?", (job_id,)
        ).fetchone()
        seq = int(row[0])
        conn.execute(
            "INSERT INTO events (job_id, seq, ts, type, data) VALUES (?, ?, ?, ?, ?)",
            (job_id, seq, ts, type, _dumps(data)),
        )
        return seq
