"""Jobs through a real `mlxbun serve` subprocess: routes, SSE, the CLI, restarts."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import run_cli
from serverutil import start_server, wait_for

from mlxbun_cli.jobs.client import parse_sse

SERVE_ARGS: tuple[str, ...] = ()  # the default (isolated) server


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat_rows(n: int, max_tokens: int, bias: dict) -> list[dict]:
    return [
        {
            "custom_id": f"c{i}",
            "messages": [{"role": "user", "content": f"Tell me story {i}"}],
            "max_tokens": max_tokens,
            "logit_bias": bias,
        }
        for i in range(n)
    ]


def job(url: str, job_id: str) -> dict:
    return httpx.get(f"{url}/api/jobs/{job_id}", timeout=10).json()["job"]


def wait_state(url: str, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    def check() -> dict | None:
        found = job(url, job_id)
        return found if found["state"] in states else None

    return wait_for(check, timeout, every=0.2)


@pytest.fixture(scope="module")
def jobs_server(tiny_model_dir, tmp_path_factory):
    srv = start_server(tiny_model_dir, tmp_path_factory.mktemp("jobs-home"), *SERVE_ARGS)
    yield srv
    assert srv.stop() == 0, srv.output()


def cli(server, *args: str):
    return run_cli(*args, env={"MLXBUN_HOME": str(server.home)})


def test_bad_input_is_a_4xx_naming_the_field(jobs_server, tmp_path):
    url = jobs_server.url
    source = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    cases = [
        ({"kind": "bake", "params": {}}, "kind"),
        ({"kind": "dataset", "params": {}}, "params.input"),
        ({"kind": "dataset", "params": {"input": str(tmp_path / "none.jsonl")}}, "params.input"),
        ({"kind": "dataset", "params": {"input": str(source), "model": "nope"}}, "params.model"),
        (
            {"kind": "dataset", "params": {"input": str(source), "output": f"{a_file}/o.jsonl"}},
            "params.output",
        ),
        ({"kind": "quantize", "params": {"model": "no/such-model"}}, "params.model"),
        ({"kind": "finetune", "params": "x"}, "params"),
    ]
    for body, field in cases:
        r = httpx.post(f"{url}/api/jobs", json=body, timeout=10)
        assert r.status_code == 400, (body, r.text)
        data = r.json()
        assert data["ok"] is False and data["field"] == field and data["error"]
    r = httpx.post(f"{url}/api/jobs", content=b"{nope", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    for method, path in (
        ("GET", "/api/jobs/job_missing"),
        ("GET", "/api/jobs/job_missing/stream"),
        ("POST", "/api/jobs/job_missing/cancel"),
        ("POST", "/api/jobs/job_missing/resume"),
        ("DELETE", "/api/jobs/job_missing"),
    ):
        r = httpx.request(method, url + path, timeout=10)
        assert r.status_code == 404 and r.json() == {
            "ok": False,
            "error": "job not found",
            "type": "not_found_error",
            "field": "id",
        }
    r = httpx.get(f"{url}/api/jobs", params={"limit": "x"}, timeout=10)
    assert r.status_code == 400 and r.json()["field"] == "limit"
    r = httpx.get(f"{url}/api/jobs", params={"kind": "bake"}, timeout=10)
    assert r.status_code == 400 and r.json()["field"] == "kind"


def test_sse_replays_then_streams_live(jobs_server, tmp_path, no_eos_bias):
    url = jobs_server.url
    # Long enough that the job is still running when the stream attaches.
    source = write_jsonl(tmp_path / "in.jsonl", chat_rows(24, 96, no_eos_bias))
    out = tmp_path / "out.jsonl"
    params = {"input": str(source), "output": str(out), "concurrency": 2}
    r = httpx.post(f"{url}/api/jobs", json={"kind": "dataset", "params": params}, timeout=10)
    assert r.status_code == 201, r.text
    created = r.json()["job"]
    assert created["state"] == "queued" and created["output"] == str(out)
    assert created["params"]["defaults"] == {} and created["params"]["concurrency"] == 2
    job_id = created["id"]
    # Attach once the job is under way: past events come first, then live ones.
    wait_for(lambda: job(url, job_id)["progress"].get("done", 0) >= 2, timeout=120)
    attached = time.time()
    with httpx.stream("GET", f"{url}/api/jobs/{job_id}/stream", timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        received = [(kind, data, time.time()) for kind, data in parse_sse(response.iter_lines())]
    kinds = [kind for kind, _, _ in received]
    assert kinds[-1] == "end" and kinds.count("end") == 1
    end = received[-1][1]
    assert end["reason"] == "finished" and end["job"]["state"] == "succeeded"
    events = [data for kind, data, _ in received[:-1]]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # whole, in order
    assert events[0]["type"] == "state" and events[0]["data"] == {"state": "queued"}
    assert events[-1]["data"] == {"state": "succeeded"}
    replayed = [e for e in events if e["ts"] < attached]
    live = [e for e, (_, _, at) in zip(events, received, strict=False) if e["ts"] > attached]
    assert replayed and live  # some were history, some arrived while we listened
    assert any(e["type"] == "progress" and e["data"]["done"] == 24 for e in live)
    assert len(out.read_text().splitlines()) == 24
    # After the end, a new stream replays it all and ends at once; `after` skips ahead.
    with httpx.stream(
        "GET", f"{url}/api/jobs/{job_id}/stream", params={"after": 3}, timeout=10
    ) as response:
        again = list(parse_sse(response.iter_lines()))
    assert again[0][1]["seq"] == 4 and again[-1][0] == "end"


def test_cli_against_the_daemon(jobs_server, tmp_path, tiny_model_dir):
    rows = [
        {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4} for i in range(6)
    ]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "answers.jsonl"
    r = cli(jobs_server, "jobs", "submit", "dataset", str(source), "-o", str(out), "--watch")
    assert r.returncode == 0, r.stderr
    assert "succeeded" in r.stdout and str(out) in r.stdout
    listed = json.loads(cli(jobs_server, "jobs", "list", "--json", "--kind", "dataset").stdout)
    mine = [j for j in listed if j["output"] == str(out)]
    assert len(mine) == 1 and mine[0]["state"] == "succeeded"
    job_id = mine[0]["id"]
    shown = json.loads(cli(jobs_server, "jobs", "show", job_id[:10], "--json").stdout)
    assert shown["id"] == job_id and shown["progress"]["done"] == 6
    logs = cli(jobs_server, "jobs", "logs", job_id).stdout
    assert "6 requests, 0 already done, 6 to run" in logs and "succeeded" in logs
    table = cli(jobs_server, "jobs", "list").stdout
    assert job_id in table and "succeeded" in table
    watched = cli(jobs_server, "jobs", "watch", job_id)
    assert watched.returncode == 0 and "succeeded" in watched.stdout
    resumed = cli(jobs_server, "jobs", "resume", job_id)
    assert resumed.returncode == 2 and "only interrupted, failed, cancelled" in resumed.stderr
    missing = cli(jobs_server, "jobs", "submit", "dataset", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and "params.input: no such file" in missing.stderr
    # `generate --batch` goes to the daemon when it runs the model asked for.
    out2 = tmp_path / "via-daemon.jsonl"
    r = run_cli(
        "generate", "--batch", str(source), "-o", str(out2), "--json",
        env={"MLXBUN_HOME": str(jobs_server.home), "MLXBUN_DEFAULT_MODEL": str(tiny_model_dir)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["where"] == jobs_server.url
    assert len(out2.read_text().splitlines()) == 6
    removed = cli(jobs_server, "jobs", "rm", job_id, "--outputs")
    assert removed.returncode == 0 and not out.exists()
    assert httpx.get(f"{jobs_server.url}/api/jobs/{job_id}", timeout=10).status_code == 404


def test_no_daemon_means_a_clear_error(tmp_path):
    r = run_cli("jobs", "submit", "dataset", str(tmp_path / "x.jsonl"))
    assert r.returncode == 1
    assert "no mlxbun daemon is running" in r.stderr and "mlxbun serve -d" in r.stderr
    assert json.loads(run_cli("jobs", "list", "--json").stdout) == []


def test_restart_marks_a_killed_daemons_job_interrupted(tiny_model_dir, tmp_path, no_eos_bias):
    home = tmp_path / "home"
    source = write_jsonl(tmp_path / "in.jsonl", chat_rows(48, 48, no_eos_bias))
    out = tmp_path / "out.jsonl"
    srv = start_server(tiny_model_dir, home, *SERVE_ARGS)
    try:
        params = {"input": str(source), "output": str(out), "concurrency": 4}
        r = httpx.post(
            f"{srv.url}/api/jobs", json={"kind": "dataset", "params": params}, timeout=10
        )
        job_id = r.json()["job"]["id"]
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 4, timeout=120)
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait()
    finally:
        srv.stop()
    again = start_server(tiny_model_dir, home, *SERVE_ARGS)
    try:
        interrupted = job(again.url, job_id)
        assert interrupted["state"] == "interrupted"
        assert "resume" in interrupted["error"]
        done_before = out.read_bytes().count(b"\n")
        assert done_before < 48
        r = httpx.post(f"{again.url}/api/jobs/{job_id}/resume", timeout=10)
        assert r.status_code == 200 and r.json()["job"]["state"] == "queued"
        final = wait_state(again.url, job_id, ("succeeded", "failed"), timeout=240)
        assert final["state"] == "succeeded", final
        assert final["attempt"] == 2
    finally:
        assert again.stop() == 0, again.output()
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"c{i}" for i in range(48))  # each exactly once


def test_shutdown_interrupts_the_running_job(tiny_model_dir, tmp_path, no_eos_bias):
    home = tmp_path / "home"
    source = write_jsonl(tmp_path / "in.jsonl", chat_rows(200, 64, no_eos_bias))
    out = tmp_path / "out.jsonl"
    srv = start_server(tiny_model_dir, home, *SERVE_ARGS)
    params = {"input": str(source), "output": str(out), "concurrency": 4}
    r = httpx.post(f"{srv.url}/api/jobs", json={"kind": "dataset", "params": params}, timeout=10)
    job_id = r.json()["job"]["id"]
    events: list[tuple[str, dict]] = []

    def listen() -> None:
        with httpx.stream("GET", f"{srv.url}/api/jobs/{job_id}/stream", timeout=60) as response:
            events.extend(parse_sse(response.iter_lines()))

    listener = threading.Thread(target=listen)
    listener.start()
    wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 4, timeout=120)
    started = time.time()
    assert srv.stop() == 0, srv.output()
    assert time.time() - started < 15
    listener.join(10)
    assert events and events[-1][0] == "end"  # the stream ended with a frame, not a cut
    from mlxbun_cli.jobs.store import JobStore

    stored = JobStore(home / "data" / "jobs.db").require(job_id)
    assert stored.state == "interrupted", (stored.error, srv.output()[-3000:])
