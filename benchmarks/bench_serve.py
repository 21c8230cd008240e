#!/usr/bin/env python3
"""`mlxbun serve` vs `mlx_lm.server` (and vs mlxbun's own in-process engine), in one run.

Run it with the project's venv:

    .venv/bin/python benchmarks/bench_serve.py            # full run (~4-6 min on 2 cores)
    .venv/bin/python benchmarks/bench_serve.py --quick    # fewer rounds (~1.5 min)
    .venv/bin/python benchmarks/bench_serve.py --json     # one JSON object on stdout

Every target is printed as both sides, the ratio and PASS/FAIL; nothing is
asserted (add --fail-on-miss for a non-zero exit code).

Issue 3 (same model, same machine, streaming, greedy, N=200, tiny model):
  * single-stream decode tok/s through `mlxbun serve` >= 0.95 x mlxbun's
    in-process engine (LocalBackend) and >= 1.5 x `mlx_lm.server`;
  * median time to first token <= mlx_lm.server's;
  * aggregate tok/s with 8 concurrent streams >= 1.2 x mlx_lm.server;
  * process spawn -> first /health 200 <= mlx_lm.server's (mlxbun isolated
    default and --in-process).
Issue 4 (mlxbun only):
  * constrained decoding (regex grammar; JSON schema) costs <= 15% of decode
    tok/s vs the same request unconstrained (30m model);
  * streaming /v1/messages and /v1/responses >= 0.95 x /v1/chat/completions.
Issue 5:
  * isolated (default) streaming decode >= 0.97 x --in-process (tiny model);
  * parent RSS with no model resident <= 120 MB (after POST /api/models/unload);
  * worker respawn (kill -9) to ready <= 2 s + the model's in-process load time.

Method (see benchmarks/README.md, "bench_serve.py"):
  * All servers of a section run side by side; requests alternate between
    them, one at a time, in an order rotated every round, and ratios are medians
    of per-round ratios (bootstrap 90% interval). The CPU load of other
    processes during each section is measured from /proc and reported.
  * Decode tok/s is measured by the client for every side the same way:
    (N - 1) / (arrival of the last token event - arrival of the first), N from
    the response's usage; TTFT = request sent -> first token event. Every
    request opens a fresh connection (mlx_lm.server closes its connections).
  * Random-weight models stop at random: every request (both servers) carries
    a logit_bias of -100 on the EOS ids of generation_config.json and on the
    other special/added tokens (<think>, <tool_call>, ...), so each decode runs
    the full N tokens as plain text; token counts are checked on every request.
    /v1/messages has no logit_bias, so the wire comparison uses a prompt that
    greedily decodes N tokens without it (probed first).
  * Each round uses a fresh prompt (a round number in it), the same for every
    side, so no server gets a prompt-cache hit on prefill.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import (  # noqa: E402  (benchmarks/ is not a package)
    REPO,
    RESULT_MARK,
    bench_env,
    bootstrap_median_ci,
    ensure_models,
    fmt,
    log,
    machine,
    median,
    printer,
    quartiles,
    rnd,
    tail,
    venv_script,
    versions,
)

# -- targets ------------------------------------------------------------------------
T_SERVE_VS_LOCAL = 0.95
T_SERVE_VS_MLXLM = 1.5
T_TTFT = 1.0  # mlxbun / mlx_lm <= 1
T_CONC = 1.2
T_STARTUP = 1.0  # mlxbun / mlx_lm <= 1
T_CONSTRAINED_COST = 0.15  # constrained >= 0.85 x unconstrained
T_WIRES = 0.95
T_ISOLATED = 0.97
T_PARENT_RSS_MB = 120.0
T_RESPAWN_EXTRA_S = 2.0

BIAS = -100.0  # mlxbun clamps logit_bias to [-100, 100]; both servers get the same value
PROMPT = "Tell me a long story about the sea and the ships on it"
WIRE_PROMPTS = (
    "Tell me a story about the sea",
    "Write a haiku about the morning river",
    "Explain how to make a good cup of tea",
    "What is the capital of France?",
    "Hello there",
    "Describe a walk in the forest",
)
# (quick, full)
ROUNDS = {
    "startup": (1, 3),
    "single": (10, 30),
    "conc": (3, 6),
    "wires": (8, 20),
    "constrained": (3, 6),
    "respawn": (1, 2),
}
CONC_STREAMS = 8


# ---------------------------------------------------------------------------
# CPU load of the machine, and of our own processes
# ---------------------------------------------------------------------------

_HZ = os.sysconf("SC_CLK_TCK")


def _backoff(restarts_before: int) -> float:
    """The supervisor's delay before this respawn (its own constants, so they stay in step)."""
    from mlxbun_cli.server.supervisor import BACKOFF_MAX, BACKOFF_START

    return min(BACKOFF_MAX, BACKOFF_START * 2 ** min(restarts_before, 6))


def _proc_cpu(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])  # utime + stime (not reaped children's)
    except (OSError, IndexError, ValueError):
        return None


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _our_tree() -> list[int]:
    kids, out, todo = _children_map(), [], [os.getpid()]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _system_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return sum(vals[:8]) - idle, sum(vals[:8])


class CpuWindow:
    """Busy cores of the whole machine, of this benchmark's process tree, and of the rest."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.busy0, _ = _system_jiffies()
        self.ours0 = {p: _proc_cpu(p) for p in _our_tree()}
        self.reaped0 = self._reaped()
        self.load0 = os.getloadavg()[0]

    @staticmethod
    def _reaped() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # children (and theirs) that exited
        return ru.ru_utime + ru.ru_stime

    def close(self) -> dict[str, Any]:
        dt = time.perf_counter() - self.t0
        busy1, _ = _system_jiffies()
        ours = 0
        for p in _our_tree():
            now = _proc_cpu(p)
            if now is None:
                continue
            ours += now - (self.ours0.get(p) or 0)
        total = (busy1 - self.busy0) / _HZ / dt if dt > 0 else 0.0
        mine = (ours / _HZ + self._reaped() - self.reaped0) / dt if dt > 0 else 0.0
        return {
            "seconds": round(dt, 1),
            "busy_cores": round(total, 2),
            "bench_cores": round(mine, 2),
            # processes that are not ours (other engineers' tests); can dip below 0
            # by a rounding hair, or miss our processes that exited meanwhile
            "other_cores": round(max(0.0, total - mine), 2),
            "loadavg_1m": [round(self.load0, 2), round(os.getloadavg()[0], 2)],
        }


# ---------------------------------------------------------------------------
# the client: one streaming request, timed per event
# ---------------------------------------------------------------------------


def _token_text(wire: str, event: str | None, obj: dict[str, Any]) -> str | None:
    """The generated text an SSE event carries (None: not a token event)."""
    if wire == "chat":
        choices = obj.get("choices") or []
        if not choices:
            return None
        delta = choices[0].get("delta") or {}
        text = "".join(delta.get(k) or "" for k in ("content", "reasoning_content", "reasoning"))
        return text or None
    if wire == "messages":
        if obj.get("type") == "content_block_delta":
            d = obj.get("delta") or {}
            return (d.get("text") or d.get("thinking") or "") or None
        return None
    if wire == "responses":
        kind = obj.get("type") or event or ""
        if kind.endswith(".delta") and ("text" in kind or "reasoning" in kind):
            return obj.get("delta") or None
        return None
    raise ValueError(wire)


def _usage(wire: str, obj: dict[str, Any], out: dict[str, Any]) -> None:
    if wire == "chat":
        if obj.get("usage"):
            out["tokens"] = obj["usage"].get("completion_tokens")
            out["prompt_tokens"] = obj["usage"].get("prompt_tokens")
            timings = obj["usage"].get("timings") or {}  # mlxbun's own, engine-side
            out["engine_ttft_s"] = timings.get("time_to_first_token_s")
        for c in obj.get("choices") or []:
            if c.get("finish_reason"):
                out["finish"] = c["finish_reason"]
        if obj.get("error"):
            out["error"] = str(obj["error"])[:300]
    elif wire == "messages":
        kind = obj.get("type")
        if kind == "message_start":
            out["prompt_tokens"] = ((obj.get("message") or {}).get("usage") or {}).get(
                "input_tokens"
            )
        elif kind == "message_delta":
            out["tokens"] = (obj.get("usage") or {}).get("output_tokens")
            out["finish"] = (obj.get("delta") or {}).get("stop_reason")
        elif kind == "error":
            out["error"] = str(obj.get("error"))[:300]
    elif wire == "responses":
        kind = obj.get("type")
        if kind in ("response.completed", "response.incomplete"):
            resp = obj.get("response") or {}
            usage = resp.get("usage") or {}
            out["tokens"] = usage.get("output_tokens")
            out["prompt_tokens"] = usage.get("input_tokens")
            out["finish"] = resp.get("status")
        elif kind in ("error", "response.failed"):
            out["error"] = json.dumps(obj)[:300]


def stream_request(
    url: str, path: str, body: dict[str, Any], wire: str = "chat", timeout: float = 300
) -> dict[str, Any]:
    """POST one streaming request on a fresh connection; time every token event."""
    u = urlsplit(url)
    payload = json.dumps(body).encode()
    out: dict[str, Any] = {"tokens": None, "prompt_tokens": None, "finish": None}
    t0 = time.perf_counter()
    times: list[float] = []
    parts: list[str] = []
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(
            "POST",
            path,
            body=payload,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return out
        buf = b""
        while True:
            data = resp.read1(65536)
            if not data:
                break
            now = time.perf_counter()
            buf += data.replace(b"\r\n", b"\n")
            while True:
                i = buf.find(b"\n\n")
                if i < 0:
                    break
                raw, buf = buf[:i], buf[i + 2 :]
                event, lines = None, []
                for line in raw.split(b"\n"):
                    if line.startswith(b"event:"):
                        event = line[6:].strip().decode()
                    elif line.startswith(b"data:"):
                        lines.append(line[5:].strip())
                if not lines:
                    continue  # a comment (keep-alive)
                data_s = b"\n".join(lines)
                if data_s == b"[DONE]":
                    continue
                try:
                    obj = json.loads(data_s)
                except ValueError:
                    continue
                text = _token_text(wire, event, obj)
                if text:
                    times.append(now)
                    parts.append(text)
                _usage(wire, obj, out)
    except (OSError, http.client.HTTPException) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    end = time.perf_counter()
    n = out["tokens"] if out["tokens"] is not None else len(times)
    out.update(
        tokens=n,
        events=len(times),
        ttft_s=times[0] - t0 if times else None,
        wall_s=end - t0,
        t_start=t0,
        t_first=times[0] if times else None,
        t_last=times[-1] if times else None,
        text="".join(parts),
    )
    window = (times[-1] - times[0]) if len(times) > 1 else 0.0
    out["decode_tps"] = (n - 1) / window if n and n > 1 and window > 0 else None
    return out


def get_json(url: str, path: str, timeout: float = 5) -> tuple[int, Any]:
    return request_json(url, "GET", path, None, timeout)


def post_json(url: str, path: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, Any]:
    return request_json(url, "POST", path, body, timeout)


def request_json(
    url: str, method: str, path: str, body: dict[str, Any] | None, timeout: float
) -> tuple[int, Any]:
    """Status and JSON reply (or the raw bytes, when the reply is not JSON)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        if body is None:
            conn.request(method, path)
        else:
            headers = {"Content-Type": "application/json"}
            conn.request(method, path, body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# the servers
# ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Server:
    """A server subprocess: `mlxbun serve` (isolated or --in-process) or `mlx_lm server`."""

    def __init__(self, kind: str, model: Path, root: Path, env: dict[str, str]) -> None:
        self.kind = kind  # "mlxbun" | "mlxbun-inproc" | "mlx_lm"
        self.model = model
        self.root = root
        self.env = dict(env)
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.spawned = 0.0
        self.health_s: float | None = None
        self.home = root / f"home-{kind}-{uuid.uuid4().hex[:6]}"
        self.log = self.home / "server.log"

    @property
    def label(self) -> str:
        return {
            "mlxbun": "mlxbun serve",
            "mlxbun-inproc": "mlxbun serve --in-process",
            "mlx_lm": "mlx_lm.server",
        }[self.kind]

    @property
    def model_field(self) -> str:
        # mlx_lm treats any other name as a Hub repo; mlxbun answers any name with its model
        return "default_model" if self.kind == "mlx_lm" else "default"

    def start(self, timeout: float = 120) -> Server:
        self.home.mkdir(parents=True, exist_ok=True)
        # Own state (each server is its own daemon), one shared cache, as one user has.
        shared_cache = self.root / "shared-cache"
        shared_cache.mkdir(exist_ok=True)
        if not (self.home / "cache").exists():
            (self.home / "cache").symlink_to(shared_cache)
        env = {**self.env, "MLXBUN_HOME": str(self.home)}
        if self.kind == "mlx_lm":
            port = free_port()
            cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(self.model),
                   "--port", str(port), "--log-level", "WARNING"]  # fmt: skip
            self.url = f"http://127.0.0.1:{port}"
        else:
            cmd = [venv_script("mlxbun"), "serve", str(self.model), "--port", "0",
                   "--log-level", "warning"]  # fmt: skip
            if self.kind == "mlxbun-inproc":
                cmd.append("--in-process")
        state = self.home / "state" / "daemon.json"
        with open(self.log, "wb") as out:
            self.spawned = time.perf_counter()
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                start_new_session=True,
            )  # fmt: skip
        deadline = self.spawned + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.label} exited {self.proc.returncode}: {tail(self.output())}"
                )
            if self.url is None:
                try:
                    info = json.loads(state.read_text())
                    if info.get("pid") == self.proc.pid:
                        self.url = info["url"]
                except (OSError, ValueError, KeyError):
                    pass
            if self.url is not None:
                try:
                    status, _ = get_json(self.url, "/health", timeout=2)
                    if status == 200:
                        self.health_s = time.perf_counter() - self.spawned
                        return self
                except (OSError, http.client.HTTPException):
                    pass
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"{self.label} not healthy after {timeout}s: {tail(self.output())}")

    def settle(self, timeout: float = 20) -> Server:
        """Steady state before measuring: the model ready and, for isolated mlxbun, its
        spare worker started (its imports would otherwise share the cores with the
        first rounds)."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            status, body = get_json(self.url, "/health", timeout=2)
            ready = status == 200 and (not isinstance(body, dict) or body.get("ready", True))
            if ready and self.kind == "mlxbun":
                _, engine = get_json(self.url, "/engine", timeout=2)
                ready = isinstance(engine, dict) and "standby_pid" in engine
                if ready and engine["standby_pid"] is not None:
                    time.sleep(2.0)  # the spare's imports
                elif ready:
                    ready = False
            if ready:
                return self
            time.sleep(0.05)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: it and its workers
            self.proc.wait()

    def workers(self) -> list[dict[str, Any]]:
        status, body = get_json(self.url, "/engine")
        return body.get("workers", []) if status == 200 and isinstance(body, dict) else []

    def pids(self) -> list[int]:
        """The server process, then its model workers (isolated mode)."""
        extra = [w["pid"] for w in self.workers() if w.get("pid")] if self.kind == "mlxbun" else []
        return [self.proc.pid, *extra]


class LocalEngine:
    """mlxbun's in-process engine (LocalBackend) in a worker process, driven over stdin."""

    def __init__(self, model: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "_worker", "local", "--model", str(model)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env, cwd=REPO,
        )  # fmt: skip
        self.info = self._read()

    label = "LocalBackend (in-process engine)"

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def _read(self) -> dict[str, Any]:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(
                    f"local engine worker died: {tail(self.proc.stderr.read(), 1500)}"
                )
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])

    def run(self, body: dict[str, Any]) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def worker_local(argv: list[str]) -> None:
    """`_worker local --model DIR`: one JSON request per stdin line, one result per line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    a = ap.parse_args(argv)
    import gc

    import mlx.core  # noqa: F401  (imports before the timed load, as a server process has them)
    import mlx_lm  # noqa: F401

    from mlxbun_cli.client.backend import LocalBackend
    from mlxbun_cli.prep.events import Done, ReasoningDelta, TextDelta
    from mlxbun_cli.prep.request import GenerationRequest

    backend = LocalBackend(a.model)
    t = time.perf_counter()
    loaded = backend.loaded
    _ = loaded.scheduler
    first_load = time.perf_counter() - t
    print(
        RESULT_MARK + json.dumps({"load_s": first_load, "mlx_lm_load_s": loaded.load_seconds}),
        flush=True,
    )
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            body = json.loads(line)
            req = GenerationRequest(
                messages=body["messages"],
                max_tokens=body["max_tokens"],
                temperature=body.get("temperature", 0),
                logit_bias=body.get("logit_bias"),
                chat_template_kwargs=dict(body.get("chat_template_kwargs") or {}),
                session_id=uuid.uuid4().hex,
            )
            gc.collect()
            t0 = time.perf_counter()
            times, parts, done = [], [], None
            for event in backend.stream(req):
                now = time.perf_counter()
                if isinstance(event, Done):
                    done = event
                elif isinstance(event, (TextDelta, ReasoningDelta)) and event.text:
                    times.append(now)
                    parts.append(event.text)
            end = time.perf_counter()
            n = done.usage.completion_tokens if done else len(times)
            window = times[-1] - times[0] if len(times) > 1 else 0.0
            out = {
                "tokens": n,
                "prompt_tokens": done.usage.prompt_tokens if done else None,
                "finish": done.finish_reason if done else None,
                "events": len(times),
                "ttft_s": times[0] - t0 if times else None,
                "wall_s": end - t0,
                "decode_tps": (n - 1) / window if n > 1 and window > 0 else None,
                "engine_tps": done.usage.generation_tps if done else None,
                "text": "".join(parts),
                "error": done.error if done else "no Done event",
            }
            print(RESULT_MARK + json.dumps(out), flush=True)
    finally:
        backend.close()


def worker_loadtime(argv: list[str]) -> None:
    """`_worker loadtime --model DIR --reps K`: mlxbun's load_model time after the imports."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    t = time.perf_counter()
    import mlx.core  # noqa: F401
    import mlx_lm  # noqa: F401

    from mlxbun_cli.catalog import resolve
    from mlxbun_cli.engine.loader import load_model

    imports = time.perf_counter() - t
    loads = []
    for _ in range(a.reps):
        t = time.perf_counter()
        loaded = load_model(resolve(a.model))
        _ = loaded.scheduler
        loads.append(time.perf_counter() - t)
        loaded.close()
        del loaded
    print(RESULT_MARK + json.dumps({"imports_s": imports, "loads_s": loads}), flush=True)


def measure_load_time(model: Path, env: dict[str, str], reps: int) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "_worker", "loadtime",
         "--model", str(model), "--reps", str(reps)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith(RESULT_MARK)), None)
    if line is None:
        return {"error": tail(p.stderr, 800)}
    data = json.loads(line[len(RESULT_MARK) :])
    return {
        "imports_s": rnd(data["imports_s"], 3),
        "first_load_s": rnd(data["loads_s"][0], 3),
        "loads_s": [rnd(x, 3) for x in data["loads_s"]],
    }


# ---------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------


def forbidden_tokens(model: Path) -> dict[str, float]:
    """EOS ids (generation_config.json) and every added/special token: biased to -100."""
    ids: set[int] = set()
    with contextlib.suppress(OSError, ValueError):
        eos = json.loads((model / "generation_config.json").read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos])
    with contextlib.suppress(OSError, ValueError):
        eos = json.loads((model / "config.json").read_text()).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos])
    with contextlib.suppress(OSError, ValueError):
        for tok in json.loads((model / "tokenizer.json").read_text()).get("added_tokens", []):
            ids.add(int(tok["id"]))
    return {str(i): BIAS for i in sorted(x for x in ids if x is not None)}


def chat_body(prompt: str, n: int, bias: dict[str, float] | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if bias:
        body["logit_bias"] = bias
    body.update(extra)
    return body


def run_side(side: Any, body: dict[str, Any], pids: list[int] | None = None) -> dict[str, Any]:
    """One chat request to a server or the local engine (see with_cpu for `pids`)."""
    if isinstance(side, LocalEngine):
        return with_cpu(pids, lambda: side.run(body))
    body = {**body, "model": side.model_field}
    return with_cpu(pids, lambda: stream_request(side.url, "/v1/chat/completions", body))


def with_cpu(pids: list[int] | None, fn: Any) -> dict[str, Any]:
    """fn()'s result; with `pids`, plus the CPU those processes spent meanwhile, per token."""
    before = [_proc_cpu(p) or 0 for p in pids or []]
    out = fn()
    if pids:
        spent = [((_proc_cpu(p) or 0) - b) * 1000 / _HZ for p, b in zip(pids, before, strict=True)]
        n = max(out.get("tokens") or 1, 1)
        out["server_cpu_ms_per_token"] = sum(spent) / n
        out["server_cpu_ms_per_token_by_process"] = [x / n for x in spent]
    return out


def round_prompt(r: int, i: int = 0) -> str:
    return f"[{r}.{i}] {PROMPT}"


def check_run(run: dict[str, Any], n: int) -> str | None:
    """Why this run is not a full-length like-for-like decode (None: it is)."""
    if run.get("error"):
        return str(run["error"])[:200]
    if run.get("tokens") != n:
        return f"{run.get('tokens')} tokens, not {n} (finish {run.get('finish')})"
    if not run.get("decode_tps"):
        return "no decode window"
    return None


def summarize_side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if not r.get("error")]
    tps = [r["decode_tps"] for r in good if r.get("decode_tps")]
    q = quartiles(tps)
    cpu = [r["server_cpu_ms_per_token"] for r in good if r.get("server_cpu_ms_per_token")]
    by_proc = [r["server_cpu_ms_per_token_by_process"] for r in good
               if r.get("server_cpu_ms_per_token_by_process")]  # fmt: skip
    return {
        "server_cpu_ms_per_token": rnd(median(cpu), 4),
        "server_cpu_ms_per_token_by_process": [
            rnd(median(list(x)), 4) for x in zip(*by_proc, strict=True)
        ]
        if by_proc
        else None,
        "decode_tps_median": rnd(median(tps), 2),
        "decode_tps_q1_q3": [rnd(q[0], 2), rnd(q[1], 2)] if q else None,
        "decode_tps_best": rnd(max(tps), 2) if tps else None,
        "ttft_s_median": rnd(median([r.get("ttft_s") for r in good]), 4),
        "wall_s_median": rnd(median([r.get("wall_s") for r in good]), 4),
        "tokens": sorted({r.get("tokens") for r in good}, key=str),
        "prompt_tokens": sorted({r.get("prompt_tokens") for r in good} - {None}),
        "events_median": median([r.get("events") for r in good]),
        "runs": len(runs),
        "errors": [r["error"] for r in runs if r.get("error")][:3],
    }


def check(
    issue: str, name: str, a_label: str, a: float | None, b_label: str, b: float | None,
    unit: str, op: str, target: float, ratios: list[float] | None = None,
    valid: bool = True, note: str = "", ratio: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One target: a vs b, ratio a/b (or the given one) against `op target`."""
    if ratio is None:
        ratio = median(ratios) if ratios else (a / b if a is not None and b else None)
    ci = bootstrap_median_ci(ratios) if ratios else None
    if ratio is None:
        verdict = "ERROR"
    elif not valid:
        verdict = "INVALID"
    else:
        ok = ratio >= target if op == ">=" else ratio <= target
        verdict = "PASS" if ok else "FAIL"
    noisy = bool(ci and ci[0] < target < ci[1])
    return {
        "issue": issue,
        "name": name,
        "a_label": a_label,
        "a": rnd(a, 4),
        "b_label": b_label,
        "b": rnd(b, 4),
        "unit": unit,
        "ratio": rnd(ratio, 4),
        "ratio_ci90": [rnd(ci[0], 4), rnd(ci[1], 4)] if ci else None,
        "op": op,
        "target": target,
        "verdict": verdict,
        "noisy": noisy,
        "n": len(ratios) if ratios else None,
        "note": note,
    }


def side_note(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Load-robust hints: upper quartile vs upper quartile, and server CPU per token."""
    parts = []
    qa, qb = a.get("decode_tps_q1_q3"), b.get("decode_tps_q1_q3")
    if qa and qb and qa[1] and qb[1]:
        parts.append(f"q3/q3 {qa[1] / qb[1]:.3f}")
    ca, cb = a.get("server_cpu_ms_per_token"), b.get("server_cpu_ms_per_token")
    if ca and cb:
        parts.append(f"server CPU ms/token {ca:.3f} vs {cb:.3f}")
    return "; ".join(parts)


def paired_ratios(
    a_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]], key: str, n: int | None,
    invert: bool = False,
) -> tuple[list[float], bool]:  # fmt: skip
    """Per-round ratios a/b of `key`; valid when every run decoded the full N."""
    ratios, valid = [], True
    for a, b in zip(a_runs, b_runs, strict=False):
        if n is not None and (check_run(a, n) or check_run(b, n)):
            valid = False
            continue
        x, y = a.get(key), b.get(key)
        if x and y:
            ratios.append(y / x if invert else x / y)
    return ratios, valid and bool(ratios)


# ---------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------


def section_startup(
    models: dict[str, Path], root: Path, env: dict[str, str], rounds: int, envs: list[str]
) -> dict[str, Any]:
    """Process spawn -> first /health 200, and -> first token of a 1-token request."""
    model = models["tiny"]
    cached_env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached_env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    environments = {"as_is": env, "bytecode_cached": cached_env}
    kinds = ["mlx_lm", "mlxbun", "mlxbun-inproc"]
    out: dict[str, Any] = {"rounds": rounds, "envs": {}}
    bias = forbidden_tokens(model)
    for ename in envs:
        e = environments[ename]
        log(f"startup ({ename}): warm-up, then {rounds} round(s) of {', '.join(kinds)}")
        if ename == "bytecode_cached":  # write the bytecode once, untimed
            for kind in kinds:
                with contextlib.suppress(RuntimeError):
                    Server(kind, model, root, e).start().stop()
        cpu = CpuWindow()
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for r in range(rounds + 1):  # round 0: page-cache warm-up, not counted
            order = kinds[r % 3 :] + kinds[: r % 3]
            for kind in order:
                srv = Server(kind, model, root, e)
                try:
                    srv.start()
                    first = stream_request(srv.url, "/v1/chat/completions",
                                           {**chat_body("hi", 1, bias), "model": srv.model_field})  # fmt: skip
                    ready = (first["t_first"] - srv.spawned) if first.get("t_first") else None
                    res = {"health_s": srv.health_s, "first_token_s": ready,
                           "error": first.get("error")}  # fmt: skip
                except RuntimeError as exc:
                    res = {"health_s": None, "first_token_s": None, "error": str(exc)[:300]}
                finally:
                    srv.stop()
                if r > 0:
                    runs[kind].append(res)
            if r > 0:
                log_round(r, {k: f"{fmt(runs[k][-1]['health_s'], 2)}s/"
                                 f"{fmt(runs[k][-1]['first_token_s'], 2)}s" for k in kinds})  # fmt: skip
        out["envs"][ename] = {
            "cpu": cpu.close(),
            "runs": runs,
            "median": {
                k: {
                    "health_s": rnd(median([x["health_s"] for x in v]), 3),
                    "first_token_s": rnd(median([x["first_token_s"] for x in v]), 3),
                }
                for k, v in runs.items()
            },
        }
    return out


def section_tiny(
    models: dict[str, Path], root: Path, env: dict[str, str], n: int, q: int, load_reps: int,
    skip_local: bool,
) -> dict[str, Any]:  # fmt: skip
    model = models["tiny"]
    bias = forbidden_tokens(model)
    out: dict[str, Any] = {"model": "tiny", "max_tokens": n, "forbidden_tokens": len(bias)}
    log("tiny: starting mlxbun serve (isolated), mlxbun serve --in-process, mlx_lm.server"
        + ("" if skip_local else " and the LocalBackend worker"))  # fmt: skip
    servers: dict[str, Any] = {}
    try:
        for kind in ("mlxbun", "mlxbun-inproc", "mlx_lm"):
            servers[kind] = Server(kind, model, root, env).start()
        for server in servers.values():
            server.settle()
        if not skip_local:
            servers["local"] = LocalEngine(model, env)
            out["local_load_s"] = rnd(servers["local"].info["load_s"], 3)
        names = list(servers)
        pids = {k: v.pids() for k, v in servers.items()}
        out["pids"] = pids
        log("tiny: warm-up (2 requests per side)")
        for side in servers.values():
            for i in range(2):
                run_side(side, chat_body(round_prompt(-1, i), n, bias))

        # -- single stream -------------------------------------------------------------
        rounds = ROUNDS["single"][q]
        log(f"tiny single-stream: {rounds} rounds x {len(names)} sides, N={n}")
        cpu = CpuWindow()
        single: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            body = chat_body(round_prompt(r), n, bias)
            for k in order:
                single[k].append(run_side(servers[k], body, pids[k]))
            log_round(r + 1, {k: fmt(single[k][-1].get("decode_tps")) for k in names})
        out["single_cpu"] = cpu.close()
        out["single"] = {k: summarize_side(v) for k, v in single.items()}
        out["single_invalid"] = [
            f"{k} round {i + 1}: {why}"
            for k, v in single.items()
            for i, run in enumerate(v)
            if (why := check_run(run, n))
        ][:6]
        out["_single_runs"] = single

        # -- 8 concurrent streams ------------------------------------------------------
        rounds = ROUNDS["conc"][q]
        conc_sides = ["mlxbun", "mlx_lm", "mlxbun-inproc"]
        log(f"tiny {CONC_STREAMS} concurrent streams: {rounds} rounds x {len(conc_sides)} servers")
        cpu = CpuWindow()
        conc: dict[str, list[dict[str, Any]]] = {k: [] for k in conc_sides}
        for r in range(rounds):
            order = conc_sides[r % 3 :] + conc_sides[: r % 3]
            for k in order:
                conc[k].append(concurrent_round(servers[k], r, n, bias, pids[k]))
            log_round(r + 1, {k: fmt(conc[k][-1].get("aggregate_tps")) for k in conc_sides})
        out["conc_cpu"] = cpu.close()
        out["conc"] = {
            k: {
                "aggregate_tps_median": rnd(median([x["aggregate_tps"] for x in v]), 2),
                "aggregate_tps_runs": [rnd(x["aggregate_tps"], 2) for x in v],
                "per_stream_decode_tps_median": rnd(
                    median([x["per_stream_decode_tps_median"] for x in v]), 2
                ),
                "ttft_s_median": rnd(median([x["ttft_s_median"] for x in v]), 4),
                "server_cpu_ms_per_token": rnd(
                    median([x["server_cpu_ms_per_token"] for x in v]), 4
                ),
                "server_cpu_ms_per_token_by_process": [
                    rnd(median(list(p)), 4)
                    for p in zip(*[x["server_cpu_ms_per_token_by_process"] for x in v], strict=True)
                ],
                "all_full_length": all(x["all_full_length"] for x in v),
                "errors": [e for x in v for e in x["errors"]][:3],
            }
            for k, v in conc.items()
        }
        out["_conc_runs"] = conc

        # -- wires: chat vs messages vs responses ---------------------------------------
        out["wires"] = section_wires(servers["mlxbun"], n, q)

        # -- respawn after kill -9 --------------------------------------------------------
        out["respawn"] = respawn(servers["mlxbun"], ROUNDS["respawn"][q])
        out["load_time"] = measure_load_time(model, env, load_reps)

        # -- parent RSS -------------------------------------------------------------------
        out["rss"] = parent_rss(servers["mlxbun"])
    finally:
        for s in servers.values():
            s.stop()
    return out


def concurrent_round(
    server: Server, r: int, n: int, bias: dict[str, float], pids: list[int]
) -> dict[str, Any]:
    results: list[dict[str, Any] | None] = [None] * CONC_STREAMS
    barrier = threading.Barrier(CONC_STREAMS + 1)

    def one(i: int) -> None:
        body = {**chat_body(round_prompt(1000 + r, i), n, bias), "model": server.model_field}
        barrier.wait()
        results[i] = stream_request(server.url, "/v1/chat/completions", body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CONC_STREAMS)]
    for t in threads:
        t.start()
    cpu0 = [_proc_cpu(p) or 0 for p in pids]
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu_ms = [((_proc_cpu(p) or 0) - c) * 1000 / _HZ for p, c in zip(pids, cpu0, strict=True)]
    runs = [x or {"error": "no result"} for x in results]
    tokens = sum(x.get("tokens") or 0 for x in runs if not x.get("error"))
    return {
        "aggregate_tps": tokens / wall if wall > 0 else None,
        "server_cpu_ms_per_token": sum(cpu_ms) / tokens if tokens else None,
        "server_cpu_ms_per_token_by_process": [x / tokens for x in cpu_ms] if tokens else None,
        "wall_s": wall,
        "tokens": tokens,
        "per_stream_decode_tps_median": median([x.get("decode_tps") for x in runs]),
        "ttft_s_median": median([x.get("ttft_s") for x in runs]),
        "all_full_length": all(check_run(x, n) is None for x in runs),
        "errors": [check_run(x, n) for x in runs if check_run(x, n)],
    }


def wire_body(wire: str, prompt: str, n: int) -> tuple[str, dict[str, Any]]:
    """The same greedy, no-thinking request on each wire (no logit_bias: /v1/messages has none)."""
    msgs = [{"role": "user", "content": prompt}]
    if wire == "chat":
        return "/v1/chat/completions", {
            "model": "default", "messages": msgs, "max_tokens": n, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False},
        }  # fmt: skip
    if wire == "messages":
        return "/v1/messages", {
            "model": "default", "messages": msgs, "max_tokens": n, "temperature": 0,
            "stream": True, "thinking": {"type": "disabled"},
        }  # fmt: skip
    return "/v1/responses", {
        "model": "default", "input": prompt, "max_output_tokens": n, "temperature": 0,
        "stream": True, "reasoning": {"effort": "none"}, "store": False,
    }  # fmt: skip


def section_wires(server: Server, n: int, q: int) -> dict[str, Any]:
    wires = ["chat", "messages", "responses"]
    pids = server.pids()
    # A prompt on which greedy decoding runs N tokens without the EOS bias.
    chosen, probes = None, []
    for prompt in WIRE_PROMPTS:
        path, body = wire_body("chat", prompt, n)
        res = stream_request(server.url, path, body, "chat")
        probes.append({"prompt": prompt, "tokens": res.get("tokens"), "events": res.get("events")})
        # every token its own event: no token held back (partial UTF-8 merges events)
        if res.get("tokens") == n and (res.get("events") or 0) >= 0.95 * n:
            chosen = prompt
            break
    if chosen is None:
        chosen = max(probes, key=lambda p: (p["tokens"] or 0, p["events"] or 0))["prompt"]
    rounds = ROUNDS["wires"][q]
    log(f"tiny wires: prompt {chosen!r}; warm-up, then {rounds} rounds x {', '.join(wires)}")
    for w in wires:
        path, body = wire_body(w, chosen, n)
        stream_request(server.url, path, body, w)
    cpu = CpuWindow()
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in wires}
    for r in range(rounds):
        order = wires[r % 3 :] + wires[: r % 3]
        for w in order:
            path, body = wire_body(w, chosen, n)
            runs[w].append(with_cpu(pids, lambda: stream_request(server.url, path, body, w)))  # noqa: B023
        log_round(r + 1, {w: fmt(runs[w][-1].get("decode_tps")) for w in wires})
    counts = {w: sorted({x.get("tokens") for x in v}, key=str) for w, v in runs.items()}
    return {
        "prompt": chosen,
        "probes": probes,
        "cpu": cpu.close(),
        "sides": {w: summarize_side(v) for w, v in runs.items()},
        "token_counts": counts,
        "same_tokens": len({json.dumps(c) for c in counts.values()}) == 1
        and len(counts["chat"]) == 1,
        "_runs": runs,
    }


def respawn(server: Server, reps: int) -> dict[str, Any]:
    """kill -9 the worker; time until /engine shows a new pid, and until it is ready."""
    out = []
    for i in range(reps):
        workers = server.workers()
        if not workers or not workers[0].get("pid"):
            out.append({"error": f"no worker in /engine: {workers}"})
            break
        old = workers[0]["pid"]
        restarts_before = workers[0].get("restarts", 0)
        log(f"respawn {i + 1}/{reps}: kill -9 worker {old}")
        t0 = time.perf_counter()
        os.kill(old, signal.SIGKILL)
        seen = ready = None
        deadline = t0 + 120
        while time.perf_counter() < deadline:
            try:
                ws = server.workers()
            except (OSError, http.client.HTTPException):
                ws = []
            now = time.perf_counter()
            w = ws[0] if ws else {}
            if w.get("pid") and w["pid"] != old:
                seen = seen or now
                if w.get("state") == "ready":
                    ready = now
                    break
            time.sleep(0.01)
        # the first request after the respawn
        body = {**chat_body("hello", 4, None), "model": "default"}
        first = stream_request(server.url, "/v1/chat/completions", body)
        out.append({
            "killed_pid": old,
            "restarts_before": restarts_before,
            "backoff_s": _backoff(restarts_before),
            "new_pid_seen_s": rnd(seen - t0, 3) if seen else None,
            "ready_s": rnd(ready - t0, 3) if ready else None,
            "first_request_ok": not first.get("error"),
        })  # fmt: skip
        log(
            f"  new pid after {fmt(out[-1]['new_pid_seen_s'], 2)}s, ready after {fmt(out[-1]['ready_s'], 2)}s"
        )
    return {"runs": out}


def parent_rss(server: Server) -> dict[str, Any]:
    pid = server.proc.pid
    workers = server.workers()
    resident = rss_mb(pid)
    worker_rss = rss_mb(workers[0]["pid"]) if workers and workers[0].get("pid") else None
    model_id = get_json(server.url, "/health")[1].get("model")
    status, body = post_json(server.url, "/api/models/unload", {"model": model_id})
    time.sleep(1.0)
    after = rss_mb(pid)
    return {
        "parent_pid": pid,
        "resident_mb": rnd(resident, 1),
        "worker_mb": rnd(worker_rss, 1),
        "unload_status": status,
        "unloaded_mb": rnd(after, 1),
        "workers_after_unload": len(server.workers()),
        "health_after_unload": get_json(server.url, "/health")[0],
    }


# -- constrained decoding (30m) ---------------------------------------------------------


def constraint_variants(n: int) -> dict[str, dict[str, Any]]:
    item = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["alpha", "beta", "gamma", "delta"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 999},
            "tag": {"type": "string", "maxLength": 8},
            "ok": {"type": "boolean"},
        },
        "required": ["kind", "count", "tag", "ok"],
        "additionalProperties": False,
    }
    schema = {"type": "array", "items": item, "minItems": n, "maxItems": n}
    return {
        "unconstrained": {},
        # far more characters than N tokens can spell: the decode runs to max_tokens
        "regex": {"grammar": {"type": "regex", "value": f"[a-z ]{{{12 * n}}}"}},
        "json_schema": {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "items", "schema": schema, "strict": True},
            }
        },
    }


def section_constrained(
    models: dict[str, Path], root: Path, env: dict[str, str], n: int, q: int, load_reps: int,
    do_respawn: bool,
) -> dict[str, Any]:  # fmt: skip
    size = "30m" if "30m" in models else "tiny"
    model = models[size]
    bias = forbidden_tokens(model)
    variants = constraint_variants(n)
    names = list(variants)
    out: dict[str, Any] = {"model": size, "max_tokens": n}
    log(f"constrained ({size}): starting mlxbun serve (isolated)")
    server = Server("mlxbun", model, root, env).start()
    try:
        out["health_s"] = rnd(server.health_s, 3)
        server.settle()
        pids = server.pids()
        log("constrained: warm-up (one request per variant; builds llguidance's tokenizer)")
        warm = {}
        for k in names:
            warm[k] = run_side(
                server, chat_body(round_prompt(-1, names.index(k)), n, bias, **variants[k])
            )
        out["warmup"] = {k: {"tokens": v.get("tokens"), "error": v.get("error"),
                             "ttft_s": rnd(v.get("ttft_s"), 3), "sample": (v.get("text") or "")[:80]}
                         for k, v in warm.items()}  # fmt: skip
        rounds = ROUNDS["constrained"][q]
        log(f"constrained: {rounds} rounds x {', '.join(names)}, N={n}")
        cpu = CpuWindow()
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
        for r in range(rounds):
            order = names[r % 3 :] + names[: r % 3]
            for k in order:
                # a prompt per variant: no prompt-cache hit from the variant before
                body = chat_body(round_prompt(r, names.index(k)), n, bias, **variants[k])
                runs[k].append(run_side(server, body, pids))
            log_round(r + 1, {k: fmt(runs[k][-1].get("decode_tps")) for k in names})
        out["cpu"] = cpu.close()
        out["sides"] = {k: summarize_side(v) for k, v in runs.items()}
        out["_runs"] = runs
        out["invalid"] = [
            f"{k} round {i + 1}: {why}"
            for k, v in runs.items()
            for i, run in enumerate(v)
            if (why := check_run(run, n))
        ][:6]
        if do_respawn:
            out["respawn"] = respawn(server, 1)
            out["load_time"] = measure_load_time(model, env, load_reps)
    finally:
        server.stop()
    return out


# ---------------------------------------------------------------------------
# verdicts
# ---------------------------------------------------------------------------


def build_checks(report: dict[str, Any], n_tiny: int, n_con: int) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    tiny = report.get("tiny")
    if tiny and "_single_runs" in tiny:
        runs = tiny["_single_runs"]
        s = tiny["single"]
        bun = runs["mlxbun"]

        def tps(k: str) -> float | None:
            return s[k]["decode_tps_median"]

        if "local" in runs:
            ratios, valid = paired_ratios(bun, runs["local"], "decode_tps", n_tiny)
            checks.append(check("3", "single-stream decode tok/s: serve vs in-process engine",
                                "mlxbun serve", tps("mlxbun"), "LocalBackend", tps("local"),
                                "tok/s", ">=", T_SERVE_VS_LOCAL, ratios, valid,
                                note=side_note(s["mlxbun"], s["local"])))  # fmt: skip
        ratios, valid = paired_ratios(bun, runs["mlx_lm"], "decode_tps", n_tiny)
        checks.append(check("3", "single-stream decode tok/s: serve vs mlx_lm.server",
                            "mlxbun serve", tps("mlxbun"), "mlx_lm.server", tps("mlx_lm"),
                            "tok/s", ">=", T_SERVE_VS_MLXLM, ratios, valid,
                            note=side_note(s["mlxbun"], s["mlx_lm"])
                            + f"; ceiling if serve matched its engine: LocalBackend / mlx_lm.server "
                            f"= {fmt(tps('local') / tps('mlx_lm') if 'local' in s and tps('mlx_lm') else None, 3)}"))  # fmt: skip
        for k, label in (("mlxbun", "mlxbun serve"), ("mlxbun-inproc", "serve --in-process")):
            a, b = s[k]["ttft_s_median"], s["mlx_lm"]["ttft_s_median"]
            ratios, _ = paired_ratios(runs[k], runs["mlx_lm"], "ttft_s", None)
            checks.append(check("3", "median time to first token (lower is better)",
                                label, a, "mlx_lm.server", b, "s", "<=", T_TTFT, ratios,
                                note=f"ratio of medians {fmt(a / b if a and b else None, 3)}"))  # fmt: skip
        c = tiny["conc"]
        conc = tiny["_conc_runs"]
        ratios = [
            x["aggregate_tps"] / y["aggregate_tps"]
            for x, y in zip(conc["mlxbun"], conc["mlx_lm"], strict=False)
            if x["aggregate_tps"] and y["aggregate_tps"]
        ]
        valid = c["mlxbun"]["all_full_length"] and c["mlx_lm"]["all_full_length"]
        checks.append(check("3", f"aggregate tok/s, {CONC_STREAMS} concurrent streams",
                            "mlxbun serve", c["mlxbun"]["aggregate_tps_median"], "mlx_lm.server",
                            c["mlx_lm"]["aggregate_tps_median"], "tok/s", ">=", T_CONC, ratios,
                            valid, note=f"server CPU ms/token {fmt(c['mlxbun']['server_cpu_ms_per_token'], 3)} "
                            f"vs {fmt(c['mlx_lm']['server_cpu_ms_per_token'], 3)}"))  # fmt: skip
    st = report.get("startup")
    if st:
        for ename, e in st["envs"].items():
            m = e["median"]
            lm = m["mlx_lm"]["health_s"]
            for kind, label in (
                ("mlxbun", "mlxbun serve"),
                ("mlxbun-inproc", "serve --in-process"),
            ):
                a = m[kind]["health_s"]
                checks.append(check(
                    "3", f"spawn -> first /health 200 ({ename}; lower is better)", label, a,
                    "mlx_lm.server", lm, "s", "<=", T_STARTUP,
                    ratio=(a / lm) if a and lm else None,
                    note=f"spawn -> first token: {fmt(m[kind]['first_token_s'], 2)}s vs "
                    f"{fmt(m['mlx_lm']['first_token_s'], 2)}s",
                ))  # fmt: skip
    con = report.get("constrained")
    if con and "_runs" in con:
        runs, s = con["_runs"], con["sides"]
        for k in ("regex", "json_schema"):
            ratios, valid = paired_ratios(runs[k], runs["unconstrained"], "decode_tps", n_con)
            checks.append(check("4", f"constrained ({k}) vs unconstrained decode tok/s ({con['model']})",
                                k, s[k]["decode_tps_median"], "unconstrained",
                                s["unconstrained"]["decode_tps_median"], "tok/s", ">=",
                                1 - T_CONSTRAINED_COST, ratios, valid,
                                note=side_note(s[k], s["unconstrained"])))  # fmt: skip
    if tiny and "wires" in tiny:
        w = tiny["wires"]
        runs, s = w["_runs"], w["sides"]
        n_w = s["chat"]["tokens"][0] if len(s["chat"]["tokens"]) == 1 else None
        for k, label in (("messages", "/v1/messages"), ("responses", "/v1/responses")):
            ratios, valid = paired_ratios(runs[k], runs["chat"], "decode_tps", n_w)
            checks.append(check("4", f"streaming decode tok/s: {label} vs /v1/chat/completions",
                                label, s[k]["decode_tps_median"], "/v1/chat/completions",
                                s["chat"]["decode_tps_median"], "tok/s", ">=", T_WIRES, ratios,
                                valid and w["same_tokens"],
                                note=f"N={n_w} (no logit_bias: a prompt that decodes N greedily); "
                                + side_note(s[k], s["chat"])))  # fmt: skip
    if tiny and "_single_runs" in tiny:
        runs, s = tiny["_single_runs"], tiny["single"]
        ratios, valid = paired_ratios(runs["mlxbun"], runs["mlxbun-inproc"], "decode_tps", n_tiny)
        checks.append(check("5", "streaming decode tok/s: isolated vs --in-process",
                            "isolated (default)", s["mlxbun"]["decode_tps_median"], "--in-process",
                            s["mlxbun-inproc"]["decode_tps_median"], "tok/s", ">=", T_ISOLATED,
                            ratios, valid, note=side_note(s["mlxbun"], s["mlxbun-inproc"])))  # fmt: skip
    if tiny and "rss" in tiny:
        r = tiny["rss"]
        a = r["unloaded_mb"]
        checks.append(check("5", "parent RSS with no model resident (lower is better)",
                            "parent, unloaded", a, "limit", T_PARENT_RSS_MB, "MB", "<=", 1.0,
                            ratio=a / T_PARENT_RSS_MB if a else None, valid=r["workers_after_unload"] == 0,
                            note=f"with the model resident: parent {fmt(r['resident_mb'])} MB, "
                            f"worker {fmt(r['worker_mb'])} MB"))  # fmt: skip
    for sec in ("tiny", "constrained"):
        d = report.get(sec)
        if not d or "respawn" not in d or "load_time" not in d:
            continue
        runs = d["respawn"]["runs"]
        lt = d["load_time"].get("first_load_s")
        first = runs[0] if runs else {}
        ready = first.get("ready_s")
        limit = T_RESPAWN_EXTRA_S + lt if lt is not None else None
        others = ", ".join(
            f"{fmt(x.get('ready_s'), 2)}s (backoff {x.get('backoff_s')}s)" for x in runs[1:]
        )
        checks.append(check("5", f"worker respawn (kill -9) -> ready, {d['model']} (lower is better)",
                            "respawn", ready, "2 s + load", limit, "s", "<=", 1.0,
                            ratio=ready / limit if ready and limit else None,
                            note=f"first kill (backoff {first.get('backoff_s')}s); model load "
                            f"{fmt(lt, 2)}s in process" + (f"; later kills: {others}" if others else "")))  # fmt: skip
    return checks


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------


def log_round(r: int, values: dict[str, str]) -> None:
    log(f"  round {r}: " + ", ".join(f"{k} {v}" for k, v in values.items()))


def render(report: dict[str, Any]) -> None:
    table, say = printer(180)

    m, v = report["machine"], report["versions"]
    say(
        f"mlxbun {v.get('mlxbun')} ({v.get('git')}) · mlx {v.get('mlx')} · mlx-lm {v.get('mlx-lm')} · "
        f"Python {v.get('python')} · {m.get('cpus')} CPUs · load {m.get('loadavg_start')} → "
        f"{m.get('loadavg_end')} · {'quick' if report['settings']['quick'] else 'full'} run"
    )
    rows = []
    for c in report["checks"]:
        verdict = c["verdict"] + (" (noisy)" if c["noisy"] else "")
        ci = c["ratio_ci90"]
        rows.append([
            c["issue"], c["name"], f"{c['a_label']}: {fmt(c['a'], 3 if c['unit'] == 's' else 1)}",
            f"{c['b_label']}: {fmt(c['b'], 3 if c['unit'] == 's' else 1)}", c["unit"],
            fmt(c["ratio"], 3), f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "-",
            f"{c['op']} {c['target']}", verdict,
        ])  # fmt: skip
    table("Targets (ratio = a / b; per-round median where rounds were paired)",
          ["#", "target", "a", "b", "unit", "ratio", "90% CI", "need", "verdict"], rows)  # fmt: skip
    for c in report["checks"]:
        if c["note"]:
            say(f"  [{c['issue']}] {c['name']}: {c['note']}")

    cpu_rows = []
    for name, cpu in report.get("cpu", {}).items():
        cpu_rows.append([name, fmt(cpu["seconds"], 0), fmt(cpu["busy_cores"], 2),
                         fmt(cpu["bench_cores"], 2), fmt(cpu["other_cores"], 2),
                         f"{cpu['loadavg_1m'][0]} → {cpu['loadavg_1m'][1]}"])  # fmt: skip
    busy = [n for n, c in report.get("cpu", {}).items() if c["other_cores"] > 0.3]
    if busy:
        say(
            f"WARNING: other processes used more than 0.3 of a core during: {', '.join(busy)}. "
            "Ratios of rounds run side by side still hold up better than absolute numbers; "
            "check the 90% intervals, or rerun on an idle machine."
        )
    if cpu_rows:
        table(f"CPU during each section ({m.get('cpus')} cores; 'others' = processes not started by this bench)",
              ["section", "s", "busy cores", "bench cores", "other cores", "load 1m"], cpu_rows)  # fmt: skip

    tiny = report.get("tiny")
    if tiny and "single" in tiny:
        rows = []
        for k, s in tiny["single"].items():
            by = s.get("server_cpu_ms_per_token_by_process") or []
            rows.append([k, fmt(s["decode_tps_median"]), f"{fmt((s['decode_tps_q1_q3'] or [None])[0])}–"
                         f"{fmt((s['decode_tps_q1_q3'] or [None, None])[1])}", fmt(s["decode_tps_best"]),
                         fmt(s["ttft_s_median"], 4), fmt(s["wall_s_median"], 3),
                         fmt(s.get("server_cpu_ms_per_token"), 3)
                         + (f" ({' + '.join(fmt(x, 3) for x in by)})" if len(by) > 1 else ""),
                         "/".join(map(str, s["tokens"])), "/".join(map(str, s["prompt_tokens"])),
                         fmt(s["events_median"], 0)])  # fmt: skip
        table(f"tiny, single stream, N={tiny['max_tokens']} (medians of {tiny['single']['mlxbun']['runs']} rounds)",
              ["side", "decode tok/s", "q1–q3", "best", "TTFT s", "wall s", "server CPU ms/tok (parent + worker)",
               "tokens", "prompt tok", "events"],
              rows)  # fmt: skip
        for why in tiny.get("single_invalid", []):
            say(f"  not full length: {why}")
        rows = [[k, fmt(c["aggregate_tps_median"]), " ".join(fmt(x) for x in c["aggregate_tps_runs"]),
                 fmt(c["per_stream_decode_tps_median"]), fmt(c["ttft_s_median"], 3),
                 fmt(c.get("server_cpu_ms_per_token"), 3)
                 + (f" ({' + '.join(fmt(x, 3) for x in by)})" if len(by := c.get("server_cpu_ms_per_token_by_process") or []) > 1 else ""),
                 "yes" if c["all_full_length"] else "NO"] for k, c in tiny["conc"].items()]  # fmt: skip
        table(f"tiny, {CONC_STREAMS} concurrent streams, N={tiny['max_tokens']} each",
              ["server", "aggregate tok/s", "runs", "per-stream decode tok/s", "TTFT s",
               "server CPU ms/tok (parent + worker)", "full length"],
              rows)  # fmt: skip
        w = tiny.get("wires")
        if w:
            rows = [[k, fmt(s["decode_tps_median"]), fmt(s["ttft_s_median"], 4),
                     fmt(s.get("server_cpu_ms_per_token"), 3), "/".join(map(str, s["tokens"])), "/".join(map(str, s["prompt_tokens"])),
                     fmt(s["events_median"], 0)] for k, s in w["sides"].items()]  # fmt: skip
            table(f"tiny, wires on mlxbun serve (prompt {w['prompt']!r})",
                  ["wire", "decode tok/s", "TTFT s", "server CPU ms/tok", "tokens", "prompt tok", "events"],
                  rows)  # fmt: skip
        r = tiny.get("rss")
        if r:
            say(
                f"  parent RSS: {r['resident_mb']} MB with the model resident (worker {r['worker_mb']} MB), "
                f"{r['unloaded_mb']} MB after unload (HTTP {r['unload_status']}, "
                f"{r['workers_after_unload']} workers left, /health {r['health_after_unload']})"
            )
    for sec in ("tiny", "constrained"):
        d = report.get(sec) or {}
        if "respawn" in d:
            for x in d["respawn"]["runs"]:
                say(f"  respawn ({d['model']}): {x}")
            say(f"  load time ({d['model']}): {d.get('load_time')}")
    con = report.get("constrained")
    if con and "sides" in con:
        rows = [[k, fmt(s["decode_tps_median"]), fmt(s["decode_tps_best"]), fmt(s["ttft_s_median"], 3),
                 fmt(s.get("server_cpu_ms_per_token"), 2), "/".join(map(str, s["tokens"])),
                 fmt(s["events_median"], 0)]
                for k, s in con["sides"].items()]  # fmt: skip
        table(f"{con['model']}, constrained decoding on mlxbun serve, N={con['max_tokens']}",
              ["variant", "decode tok/s", "best", "TTFT s", "server CPU ms/tok", "tokens", "events"], rows)  # fmt: skip
        for k, wv in con.get("warmup", {}).items():
            say(f"  warm-up {k}: {wv}")
        for why in con.get("invalid", []):
            say(f"  not full length: {why}")
    st = report.get("startup")
    if st:
        rows = []
        for ename, e in st["envs"].items():
            for k, mm in e["median"].items():
                rows.append([ename, k, fmt(mm["health_s"], 3), fmt(mm["first_token_s"], 3),
                             " ".join(fmt(x["health_s"], 2) for x in e["runs"][k])])  # fmt: skip
        table(f"start-up, tiny model (median of {st['rounds']} rounds after a warm-up round)",
              ["env", "server", "spawn → /health 200 s", "spawn → first token s", "runs (health)"], rows)  # fmt: skip
        say(
            "  note: /health 200 means 'taking requests', not 'model loaded': mlx_lm.server and "
            "isolated mlxbun answer it while the model loads (requests wait); mlxbun --in-process "
            "answers 503 until it is loaded. 'first token' is the like-for-like readiness."
        )
    say(f"total bench time {report['elapsed_s']:.0f}s")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Verdicts are reported, never asserted (exit 0) unless --fail-on-miss.",
    )
    ap.add_argument("--quick", action="store_true", help="fewer rounds (~2 min)")
    ap.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="build/reuse demo models here (default: a temp dir, removed after)")  # fmt: skip
    ap.add_argument(
        "--max-tokens", type=int, default=200, help="N for the tiny model (default 200)"
    )
    ap.add_argument("--constrained-tokens", type=int, default=None,
                    help="N for the constrained section (default: 128, quick 48)")  # fmt: skip
    ap.add_argument("--constrained-model", default="30m", choices=["30m", "tiny"])
    ap.add_argument("--startup-env", default=None,
                    help="as_is,bytecode_cached (default: both; quick: bytecode_cached)")  # fmt: skip
    ap.add_argument("--skip", default="",
                    help="comma list of sections to skip: startup,tiny,constrained,local")  # fmt: skip
    ap.add_argument("--render", type=Path, default=None, metavar="REPORT_JSON",
                    help="print the tables of a saved --json report and exit")  # fmt: skip
    ap.add_argument("--fail-on-miss", action="store_true",
                    help="exit 1 when a verdict is FAIL/INVALID/ERROR")  # fmt: skip
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["_worker", "local"]:
        worker_local(argv[2:])
        return 0
    if argv[:2] == ["_worker", "loadtime"]:
        worker_loadtime(argv[2:])
        return 0
    args = parse_args(argv)
    if args.render is not None:
        render(json.loads(args.render.read_text()))
        return 0
    started = time.perf_counter()
    q = 0 if args.quick else 1
    skip = {s for s in args.skip.split(",") if s}
    n_con = args.constrained_tokens or (48 if args.quick else 128)
    startup_envs = (
        args.startup_env or ("bytecode_cached" if args.quick else "as_is,bytecode_cached")
    ).split(",")
    report: dict[str, Any] = {
        "versions": versions(),
        "machine": machine(),
        "settings": {
            "quick": args.quick,
            "max_tokens": args.max_tokens,
            "constrained_tokens": n_con,
            "constrained_model": args.constrained_model,
            "rounds": {k: v[q] for k, v in ROUNDS.items()},
            "startup_envs": startup_envs,
            "skip": sorted(skip),
        },
        "cpu": {},
    }
    tmp = Path(tempfile.mkdtemp(prefix="mlxbun-bench-serve-"))
    try:
        env = bench_env(tmp / "home")
        sizes = ["tiny"] + (
            ["30m"] if "constrained" not in skip and args.constrained_model == "30m" else []
        )
        models = ensure_models(Path(args.models_dir or tmp / "models").expanduser(), sizes, env)
        load_reps = 2 if args.quick else 3
        if "tiny" not in skip:
            try:
                tiny = section_tiny(
                    models, tmp, env, args.max_tokens, q, load_reps, "local" in skip
                )
            except RuntimeError as exc:
                tiny = {"error": str(exc)[:1500]}
                log(f"tiny section failed: {exc}")
            report["tiny"] = tiny
            for key in ("single_cpu", "conc_cpu"):
                if key in tiny:
                    report["cpu"][f"tiny {key[:-4]}"] = tiny[key]
            if "wires" in tiny:
                report["cpu"]["tiny wires"] = tiny["wires"]["cpu"]
        if "constrained" not in skip:
            cm = {args.constrained_model: models[args.constrained_model]}
            try:
                con = section_constrained(cm, tmp, env, n_con, q, load_reps, not args.quick)
            except RuntimeError as exc:
                con = {"error": str(exc)[:1500]}
                log(f"constrained section failed: {exc}")
            report["constrained"] = con
            if "cpu" in con:
                report["cpu"]["constrained"] = con["cpu"]
        if "startup" not in skip:
            st = section_startup(models, tmp, env, ROUNDS["startup"][q], startup_envs)
            report["startup"] = st
            for ename, e in st["envs"].items():
                report["cpu"][f"startup {ename}"] = e["cpu"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    report["checks"] = build_checks(report, args.max_tokens, n_con)
    report["all_pass"] = bool(report["checks"]) and all(
        c["verdict"] == "PASS" for c in report["checks"]
    )
    # raw runs stay in the JSON, minus the generated text
    for sec in (
        report.get("tiny") or {},
        report.get("constrained") or {},
        (report.get("tiny") or {}).get("wires") or {},
    ):
        for key in ("_single_runs", "_conc_runs", "_runs"):
            if key in sec:
                for runs in sec[key].values():
                    for run in runs:
                        if isinstance(run, dict):
                            run.pop("text", None)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report)
    return 1 if args.fail_on_miss and not report["all_pass"] else 0


if __name__ == "__main__":
    sys.exit(main())
