"""Isolated mode: worker processes, failure frames, respawn, residency, admission."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from serverutil import REPO, start_server, wait_for

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def engine(server) -> dict:
    return httpx.get(server.url + "/engine", timeout=10).json()


def test_parent_never_imports_mlx():
    code = (
        "import sys, pathlib\n"
        "from mlxbun_cli.server.parent import create_parent_app\n"
        "from mlxbun_cli.server.state import ServeOptions\n"
        "from mlxbun_cli.catalog import ModelRef\n"
        "create_parent_app(ServeOptions(isolated=True), ModelRef('m', pathlib.Path('.'), 'path'))\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('mlx', 'mlx_lm', 'transformers', 'numpy', 'tokenizers', 'llguidance')]\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "[]"


def _stream_lines(url: str, path: str, body: dict, sink: list[str]) -> None:
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        for line in r.iter_lines():
            sink.append(line)


@pytest.mark.parametrize(
    "path, body, check",
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "stream": True},
            lambda lines: (
                json.loads(lines[-2][6:])["error"]["type"] == "engine_unavailable"
                and lines[-1] == "data: [DONE]"
            ),
        ),
        (
            "/v1/messages",
            {"messages": [{"role": "user", "content": "x"}], "stream": True},
            lambda lines: (
                "event: error" in lines
                and json.loads(lines[lines.index("event: error") + 1][6:])["error"]["type"]
                == "api_error"
            ),
        ),
    ],
)
def test_worker_killed_mid_stream_ends_with_the_wires_error_frame(
    server, no_eos_bias, path, body, check
):
    body = {**body, "max_tokens": 5000, "temperature": 0, "logit_bias": no_eos_bias}
    if path == "/v1/messages":
        body["logit_bias"] = no_eos_bias  # extra field, ignored by the wire if unknown
    before = engine(server)["workers"][0]
    lines: list[str] = []
    reader = threading.Thread(target=_stream_lines, args=(server.url, path, body, lines))
    reader.start()
    wait_for(lambda: len(lines) > 10)
    os.kill(before["pid"], signal.SIGKILL)
    reader.join(30)
    non_empty = [line for line in lines if line]
    assert check(non_empty), non_empty[-4:]
    after = wait_for(
        lambda: (
            (w := engine(server)["workers"][0])["state"] == "ready"
            and w["pid"] != before["pid"]
            and w
        )
    )
    assert after["restarts"] == before["restarts"] + 1
    assert after["last_exit"] == {"signal": "SIGKILL", "code": None}
    ok = httpx.post(server.url + "/v1/chat/completions", json=BODY, timeout=60)
    assert ok.status_code == 200


@pytest.fixture
def two_models(tiny_model_dir, tmp_path):
    """A second tiny model, registered under a local id, and a home that knows both."""
    from mlxbun_cli.demo_model import build_demo_model

    other = build_demo_model(tmp_path / "other-model", size="tiny", seed=1)
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "models.json").write_text(
        json.dumps({"first": str(tiny_model_dir), "second": str(other)})
    )
    return home


def ps(server) -> dict:
    return httpx.get(server.url + "/api/models/ps", timeout=10).json()


def test_budget_for_one_model_alternates_and_never_evicts_a_leased_one(two_models, no_eos_bias):
    srv = start_server("first", two_models, "--memory-budget", "100MB")
    try:
        for model in ("second", "first", "second"):
            r = httpx.post(
                srv.url + "/v1/chat/completions", json={**BODY, "model": model}, timeout=60
            )
            assert r.status_code == 200, r.text
            assert [m["model"] for m in ps(srv)["models"]] == [model]
        assert ps(srv)["evictions"] == 3
        # An unknown name is answered by the current model.
        r = httpx.post(
            srv.url + "/v1/chat/completions", json={**BODY, "model": "gpt-4o"}, timeout=60
        )
        assert r.status_code == 200
        # While "second" streams, "first" cannot evict it.
        lines: list[str] = []
        long = {
            "messages": [{"role": "user", "content": "x"}],
            "model": "second",
            "stream": True,
            "max_tokens": 3000,
            "logit_bias": no_eos_bias,
        }
        reader = threading.Thread(
            target=_stream_lines, args=(srv.url, "/v1/chat/completions", long, lines)
        )
        reader.start()
        wait_for(lambda: len(lines) > 5)
        refused = httpx.post(
            srv.url + "/v1/chat/completions", json={**BODY, "model": "first"}, timeout=60
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "memory_admission"
        assert [m["model"] for m in ps(srv)["models"]] == ["second"]
        reader.join(60)
        assert [line for line in lines if line][-1] == "data: [DONE]"
        # The lease ended with the stream: now "first" can load.
        assert (
            httpx.post(
                srv.url + "/v1/chat/completions", json={**BODY, "model": "first"}, timeout=60
            ).status_code
            == 200
        )
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        resident = {m["id"]: m["resident"] for m in models}
        assert resident["first"] and not resident["second"]
    finally:
        assert srv.stop() == 0, srv.output()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[1].split()[0] == "Z"
    except OSError:  # no /proc here
        return False


def test_standby_takes_over_a_crash_and_all_exit_when_the_parent_is_killed(
    tiny_model_dir, tmp_path
):
    srv = start_server(tiny_model_dir, tmp_path / "home")
    spare = wait_for(lambda: engine(srv)["standby_pid"])
    crashed = engine(srv)["workers"][0]["pid"]
    os.kill(crashed, signal.SIGKILL)
    # The spare (everything already imported) becomes the model's worker.
    worker = wait_for(
        lambda: (w := engine(srv)["workers"][0])["state"] == "ready" and w["pid"] != crashed and w
    )
    assert worker["pid"] == spare
    assert httpx.post(srv.url + "/v1/chat/completions", json=BODY, timeout=60).status_code == 200
    new_spare = wait_for(lambda: engine(srv)["standby_pid"])
    assert new_spare not in (spare, crashed)
    # Workers run in their own session: a SIGKILLed parent must not leave them
    # (or the spare) holding memory.
    srv.proc.kill()
    srv.proc.wait(10)
    wait_for(lambda: gone(worker["pid"]) and gone(new_spare), timeout=15)


def test_no_standby(tiny_model_dir, tmp_path):
    srv = start_server(tiny_model_dir, tmp_path / "home", "--no-standby")
    try:
        assert (
            httpx.post(srv.url + "/v1/chat/completions", json=BODY, timeout=60).status_code == 200
        )
        time.sleep(1.0)
        assert engine(srv)["standby_pid"] is None
    finally:
        assert srv.stop() == 0


def test_memory_admission_refuses_and_clamps(tiny_model_dir, tmp_path):
    srv = start_server(tiny_model_dir, tmp_path / "home", "--in-process", "--memory-budget", "1MB")
    try:
        big = {"messages": [{"role": "user", "content": "word " * 1200}], "max_tokens": 5}
        r = httpx.post(srv.url + "/v1/chat/completions", json=big, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "memory_admission"
        a = httpx.post(srv.url + "/v1/messages", json={**big, "max_tokens": 5}, timeout=60)
        assert a.status_code == 400 and a.json()["type"] == "error"
        small = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}
        ok = httpx.post(srv.url + "/v1/chat/completions", json=small, timeout=120)
        assert ok.status_code == 200
        assert ok.headers["x-max-tokens-clamped"].startswith("100000->")
    finally:
        assert srv.stop() == 0


def test_responses_history_survives_a_worker_restart(server, openai_client):
    first = openai_client.responses.create(
        model="x", input="Remember the word apple.", max_output_tokens=5
    )
    assert first.previous_response_id is None
    pid = engine(server)["workers"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (w := engine(server)["workers"][0])["state"] == "ready" and w["pid"] != pid)
    second = openai_client.responses.create(
        model="x", input="What was the word?", previous_response_id=first.id, max_output_tokens=5
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens  # turn one was in the prompt
    assert openai_client.responses.retrieve(second.id).id == second.id
    stats = httpx.get(server.url + "/stats").json()
    assert stats["response_store"]["entries"] >= 2
    with openai_client.responses.stream(
        model="x", input="and again", previous_response_id=second.id, max_output_tokens=400
    ) as stream:
        events = [e.type for e in stream]
    assert events[0] == "response.created"
    third_id = [e for e in events if e.startswith("response.")][-1]
    assert third_id in ("response.completed", "response.incomplete")


def test_models_ps_load_unload_and_stats_cli(two_models):
    from conftest import run_cli

    env = {"MLXBUN_HOME": str(two_models)}
    r = run_cli("serve", "first", "-d", "--port", "0", "--memory-budget", "1GB", env=env)
    assert r.returncode == 0, r.stderr
    try:
        ps = json.loads(run_cli("models", "ps", "--json", env=env).stdout)
        assert [m["model"] for m in ps["models"]] == ["first"] and ps["current"] == "first"
        loaded = run_cli("models", "load", "second", "--pin", env=env)
        assert loaded.returncode == 0 and "loaded" in loaded.stdout, loaded.stderr
        ps = json.loads(run_cli("models", "ps", "--json", env=env).stdout)
        assert {m["model"]: m["pinned"] for m in ps["models"]} == {"first": False, "second": True}
        table = run_cli("models", "ps", env=env)
        assert "second" in table.stdout and "pinned" in table.stdout
        stats = json.loads(run_cli("stats", "--json", env=env).stdout)
        assert stats["mode"] == "isolated" and len(stats["residency"]["models"]) == 2
        assert "second" in run_cli("stats", env=env).stdout
        assert run_cli("models", "unload", "second", env=env).returncode == 0
        again = run_cli("models", "unload", "second", env=env)
        assert again.returncode == 2 and "not resident" in again.stderr
        unknown = run_cli("models", "load", "nope", env=env)
        assert unknown.returncode == 2 and "no local model" in unknown.stderr
    finally:
        run_cli("daemon", "stop", env=env)
