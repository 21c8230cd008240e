"""Batch generation: JSONL requests in, OpenAI batch-output JSONL out, resumable.

Input lines are OpenAI batch lines (`{"custom_id", "method", "url", "body"}`)
or plain `{"prompt": …}` / `{"messages": […]}` objects (custom_id `line-N`).
Each result is appended, flushed and fsync'd as it finishes, in the order
they finish; a rerun reads the output first and skips the custom_ids already
there, cutting out a line a kill left half-written. Bad lines and failed
requests go to `OUT.errors.jsonl` with their line number; the rest run.

All requests go through one `Backend` from N threads at once, so they share
the model's continuous batch: a LocalBackend in the CLI's process, or, in
the daemon, a RemoteBackend pointed at the daemon itself. No mlx import here.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxbun_cli.client.backend import Backend, Stream
from mlxbun_cli.client.results import Collected
from mlxbun_cli.errors import BackendUnavailableError, InputError, MlxbunError, OptionError
from mlxbun_cli.jobs.context import JobContext, Stopped
from mlxbun_cli.prep.events import TokenLogprob
from mlxbun_cli.prep.request import GenerationRequest, validate
from mlxbun_cli.protocols import WireError
from mlxbun_cli.protocols import openai as wire

# Requests in flight: enough to keep mlx-lm's decode batch (32) full while others prefill.
DEFAULT_CONCURRENCY = 64

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
_URLS = {
    CHAT_URL: CHAT_URL,
    "/chat/completions": CHAT_URL,
    COMPLETIONS_URL: COMPLETIONS_URL,
    "/completions": COMPLETIONS_URL,
}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def errors_path(output: Path) -> Path:
    """`OUT.jsonl` → `OUT.errors.jsonl`."""
    stem = output.name[: -len(".jsonl")] if output.name.endswith(".jsonl") else output.name
    return output.with_name(stem + ".errors.jsonl")


# -- input -------------------------------------------------------------------------


@dataclass
class Row:
    line: int
    custom_id: str
    url: str
    request: GenerationRequest


@dataclass
class LineError(Exception):
    line: int
    custom_id: str | None
    message: str
    param: str | None = None
    code: str = "invalid_request"
    status: int | None = None

    def record(self) -> dict[str, Any]:
        response = None
        if self.status is not None:
            response = {
                "status_code": self.status,
                "request_id": _id("req"),
                "body": wire.error_body(self.message, param=self.param, code=self.code),
            }
        return {
            "id": _id("batch_req"),
            "custom_id": self.custom_id,
            "line": self.line,
            "response": response,
            "error": {"code": self.code, "message": self.message, "param": self.param},
        }


@dataclass
class ParsedInput:
    rows: list[Row] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    lines: int = 0


def parse_line(data: Any, number: int, defaults: dict[str, Any]) -> Row:
    if not isinstance(data, dict):
        raise LineError(number, None, "a line must be a JSON object")
    custom_id = data.get("custom_id", f"line-{number}")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError(number, None, "custom_id must be a non-empty string", "custom_id")
    if "body" in data or "url" in data:  # an OpenAI batch line
        method = data.get("method", "POST")
        if method != "POST":
            raise LineError(number, custom_id, f"method must be POST, got {method!r}", "method")
        url = _URLS.get(data.get("url"))  # type: ignore[arg-type]
        if url is None:
            raise LineError(
                number,
                custom_id,
                f"url must be {CHAT_URL} or {COMPLETIONS_URL}, got {data.get('url')!r}",
                "url",
            )
        body = data.get("body")
        if not isinstance(body, dict):
            raise LineError(number, custom_id, "body must be a JSON object", "body")
    else:
        body = {k: v for k, v in data.items() if k != "custom_id"}
        if "messages" in body:
            url = CHAT_URL
        elif "prompt" in body:
            url = COMPLETIONS_URL
        else:
            raise LineError(
                number,
                custom_id,
                'a line needs "messages" or "prompt" (or an OpenAI batch "url" and "body")',
            )
    parse = wire.parse_chat if url == CHAT_URL else wire.parse_completion
    try:
        request = parse({**defaults, **body})[1]
        validate(request)
    except WireError as exc:
        raise LineError(number, custom_id, exc.message, exc.param) from None
    except OptionError as exc:
        raise LineError(number, custom_id, exc.message, exc.field) from None
    return Row(number, custom_id, url, request)


def parse_input(path: Path, defaults: dict[str, Any] | None = None) -> ParsedInput:
    """Every line checked; a duplicate custom_id is an error on its later line."""
    parsed = ParsedInput()
    seen: dict[str, int] = {}
    try:
        handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        for number, text in enumerate(handle, 1):
            parsed.lines = number
            if not text.strip():
                continue
            try:
                data = json.loads(text)
            except ValueError as exc:
                parsed.errors.append(LineError(number, None, f"not valid JSON: {exc}"))
                continue
            try:
                row = parse_line(data, number, defaults or {})
            except LineError as exc:
                parsed.errors.append(exc)
                continue
            if row.custom_id in seen:
                parsed.errors.append(
                    LineError(
                        number,
                        row.custom_id,
                        f"duplicate custom_id {row.custom_id!r} (first on line {seen[row.custom_id]})",
                        "custom_id",
                    )
                )
                continue
            seen[row.custom_id] = number
            parsed.rows.append(row)
    return parsed


# -- output --------------------------------------------------------------------------


def _fsync_append(handle: Any, record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")
    handle.flush()
    os.fsync(handle.fileno())


def repair(handle: Any) -> tuple[set[str], int]:
    """custom_ids already in the output; a torn or broken line is cut out in place."""
    handle.seek(0)
    data = handle.read()
    kept: list[bytes] = []
    done: set[str] = set()
    dropped = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            custom_id = json.loads(raw)["custom_id"]
        except (ValueError, TypeError, KeyError):
            dropped += 1  # half a line from a kill
            continue
        if not isinstance(custom_id, str) or custom_id in done:
            dropped += 1
            continue
        done.add(custom_id)
        kept.append(raw)
    clean = b"".join(line + b"\n" for line in kept)
    if clean != data:
        handle.seek(0)
        handle.write(clean)
        handle.truncate()
        handle.flush()
        os.fsync(handle.fileno())
    handle.seek(0, os.SEEK_END)
    return done, dropped


class OutputFile:
    """The results file, held with an exclusive lock so two runs never share it."""

    def __init__(self, path: Path) -> None:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+b")
        try:
            fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._handle.close()
            raise InputError(
                f"{path} is being written by another batch run",
                hint="`mlxbun jobs list --state running` shows it",
            ) from None
        self.done, self.dropped = repair(self._handle)

    def append(self, record: dict[str, Any]) -> None:
        with self._lock:
            _fsync_append(self._handle, record)

    def close(self) -> None:
        self._handle.close()  # closing releases the lock


class ErrorsFile:
    """`OUT.errors.jsonl`: rewritten with the bad lines at each start, failures appended."""

    def __init__(self, path: Path, errors: list[LineError]) -> None:
        self.path = path
        self.count = 0
        self._lock = threading.Lock()
        self._handle: Any = None
        path.unlink(missing_ok=True)  # the failures of a previous run are retried
        for error in errors:
            self.append(error)

    def append(self, error: LineError) -> None:
        with self._lock:
            if self._handle is None:
                self._handle = open(self.path, "ab")  # noqa: SIM115
            _fsync_append(self._handle, error.record())
            self.count += 1

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


# -- the run -----------------------------------------------------------------------


@dataclass
class DatasetStats:
    total: int
    skipped: int
    invalid: int
    done: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = field(default_factory=time.monotonic)

    def progress(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        finished = self.done + self.failed
        remaining = self.total - self.skipped - finished
        rate = finished / elapsed if elapsed > 0 else 0.0
        return {
            "done": self.skipped + self.done,
            "total": self.total,
            "failed": self.failed,
            "skipped": self.skipped,
            "invalid": self.invalid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tok_s": round(self.completion_tokens / elapsed, 2) if elapsed > 0 else 0.0,
            "elapsed_s": round(elapsed, 2),
            "eta_s": round(remaining / rate, 1) if rate > 0 and remaining > 0 else None,
        }


def run(ctx: JobContext, backend: Backend) -> DatasetStats:
    """Run every request not yet in the output; raises Stopped when asked to stop."""
    params = ctx.params
    source, output = Path(params["input"]), Path(params["output"])
    parsed = parse_input(source, params.get("defaults") or {})
    if not parsed.rows:
        ErrorsFile(errors_path(output), parsed.errors).close()
        first = parsed.errors[0] if parsed.errors else None
        detail = f": line {first.line}: {first.message}" if first else ""
        raise InputError(
            f"{source} has no valid request lines ({len(parsed.errors)} bad{detail})",
            hint=f"every bad line is in {errors_path(output)}" if parsed.errors else None,
        )
    out = OutputFile(output)  # locked first: a second run must not touch the errors file
    try:
        errors = ErrorsFile(errors_path(output), parsed.errors)
        try:
            return _run_rows(ctx, backend, parsed, out, errors)
        finally:
            errors.close()
    finally:
        out.close()


def _run_rows(
    ctx: JobContext, backend: Backend, parsed: ParsedInput, out: OutputFile, errors: ErrorsFile
) -> DatasetStats:
    todo = [row for row in parsed.rows if row.custom_id not in out.done]
    stats = DatasetStats(
        total=len(parsed.rows), skipped=len(parsed.rows) - len(todo), invalid=len(parsed.errors)
    )
    message = f"{stats.total} requests, {stats.skipped} already done, {len(todo)} to run"
    if parsed.errors:
        message += f"; {len(parsed.errors)} bad lines in {errors.path.name}"
    if out.dropped:
        message += f"; cut {out.dropped} broken line(s) from the output"
    ctx.log(message, output=str(out.path))
    ctx.progress(stats.progress(), force=True)
    if todo:
        model = backend.model_info().id
        pool = _Pool(ctx, backend, model, out, errors, stats)
        pool.run(todo, int(ctx.params.get("concurrency") or DEFAULT_CONCURRENCY))
        if pool.fatal is not None:
            raise pool.fatal
        if pool.unfinished and not ctx.stop.is_set():
            raise MlxbunError(
                f"{pool.unfinished} request(s) were cancelled by the server; resume to retry them"
            )
    ctx.progress(stats.progress(), force=True)
    if stats.skipped + stats.done + stats.failed < stats.total:
        raise Stopped()
    if stats.failed:
        ctx.log(f"{stats.failed} request(s) failed; see {errors.path.name}")
    return stats


class _Pool:
    """N threads pulling rows; each result written the moment it is complete."""

    def __init__(
        self,
        ctx: JobContext,
        backend: Backend,
        model: str,
        out: OutputFile,
        errors: ErrorsFile,
        stats: DatasetStats,
    ) -> None:
        self.ctx, self.backend, self.model = ctx, backend, model
        self.out, self.errors, self.stats = out, errors, stats
        self.fatal: BaseException | None = None
        self.unfinished = 0
        self._lock = threading.Lock()
        self._queue: deque[Row] = deque()
        self._inflight: set[Stream] = set()
        self._abort = threading.Event()

    def run(self, rows: list[Row], concurrency: int) -> None:
        self._queue.extend(rows)
        threads = [
            threading.Thread(target=self._worker, name=f"mlxbun-batch-{i}", daemon=True)
            for i in range(max(1, min(concurrency, len(rows))))
        ]
        for thread in threads:
            thread.start()
        cancelled = False
        try:
            while any(t.is_alive() for t in threads):
                if not cancelled and (self.ctx.stop.is_set() or self._abort.is_set()):
                    self._cancel_inflight()
                    cancelled = True
                alive = next((t for t in threads if t.is_alive()), None)
                if alive is not None:
                    alive.join(0.1)
                self.ctx.flush_progress()  # the last burst of results, once the interval is up
        except KeyboardInterrupt:  # Ctrl-C in the CLI: stop cleanly, keep what is done
            self.ctx.request_stop(cancel=False)
            self._cancel_inflight()
            for thread in threads:
                thread.join()

    def _cancel_inflight(self) -> None:
        with self._lock:
            streams = list(self._inflight)
        for stream in streams:
            stream.cancel()

    def _next(self) -> Row | None:
        with self._lock:
            if self.ctx.stop.is_set() or self._abort.is_set() or not self._queue:
                return None
            return self._queue.popleft()

    def _worker(self) -> None:
        while (row := self._next()) is not None:
            try:
                self._one(row)
            except BackendUnavailableError as exc:
                if self.ctx.stop.is_set():
                    # The server shutting down under a stopping job (a row sent
                    # as the workers drain): the row is left for `resume`.
                    return
                self._fail(exc)
            except LineError as exc:
                self._record_failure(exc)
            except (MlxbunError, WireError) as exc:
                param = getattr(exc, "field", None) or getattr(exc, "param", None)
                self._record_failure(
                    LineError(row.line, row.custom_id, exc.message, param, status=400)
                )
            except Exception as exc:  # a bug: stop the job rather than fail every row
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.fatal is None:
                self.fatal = exc
        self._abort.set()

    def _record_failure(self, error: LineError) -> None:
        self.errors.append(error)
        with self._lock:
            self.stats.failed += 1
        self.ctx.progress(self.stats.progress())

    def _one(self, row: Row) -> None:
        stream = self.backend.stream(row.request)
        with self._lock:
            self._inflight.add(stream)
        collected, logprobs = Collected(), []
        try:
            if self.ctx.stop.is_set() or self._abort.is_set():
                stream.cancel()
            for event in stream:
                collected.add(event)
                if isinstance(event, TokenLogprob):
                    logprobs.append(event)
        finally:
            with self._lock:
                self._inflight.discard(stream)
        done = collected.done
        if done is None or done.finish_reason == "cancelled":
            if not (self.ctx.stop.is_set() or self._abort.is_set()):
                with self._lock:
                    self.unfinished += 1
            return
        if done.finish_reason == "error":
            raise LineError(
                row.line,
                row.custom_id,
                done.error or "generation failed",
                code="generation_failed",
                status=500,
            )
        body = self._body(row, collected, logprobs if row.request.logprobs else None)
        self.out.append(
            {
                "id": _id("batch_req"),
                "custom_id": row.custom_id,
                "response": {"status_code": 200, "request_id": _id("req"), "body": body},
                "error": None,
            }
        )
        with self._lock:
            self.stats.done += 1
            self.stats.prompt_tokens += done.usage.prompt_tokens
            self.stats.completion_tokens += done.usage.completion_tokens
        self.ctx.progress(self.stats.progress())

    def _body(self, row: Row, c: Collected, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
        assert c.done is not None
        if row.url == CHAT_URL:
            return wire.chat_response(
                wire.new_id("chatcmpl"),
                self.model,
                c.text,
                c.reasoning,
                c.tool_calls,
                logprobs,
                c.done,
            )
        return wire.completion_response(
            wire.new_id("cmpl"), self.model, c.reasoning + c.text, logprobs, c.done
        )
