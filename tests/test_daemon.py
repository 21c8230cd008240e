"""The daemon: detach, status, stop, stale state, one per state dir; API keys; shutdown."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
from conftest import run_cli
from serverutil import start_server


def status_json() -> dict:
    r = run_cli("daemon", "status", "--json")
    return json.loads(r.stdout)


def test_detach_status_generate_stop(tiny_model_dir, isolated_home):
    r = run_cli("serve", str(tiny_model_dir), "-d", "--port", "0")
    assert r.returncode == 0, r.stderr
    assert "daemon running" in r.stdout
    try:
        status = status_json()
        assert status["running"] and status["health"] == "ok"
        assert status["model"] == str(tiny_model_dir)
        assert {"pid", "url", "uptime_s", "memory"} <= set(status)
        # A second daemon on the same state dir is refused, clearly.
        again = run_cli("serve", str(tiny_model_dir), "-d", "--port", "0")
        assert again.returncode == 1 and "already running" in again.stderr
        assert "Traceback" not in again.stderr
        fg = run_cli("serve", str(tiny_model_dir), "--port", "0")
        assert fg.returncode == 1 and "already running" in fg.stderr
        # generate uses the daemon when it runs; the text matches in process.
        args = [
            "generate",
            "Hello there",
            "-n",
            "10",
            "--seed",
            "7",
            "--temp",
            "0.8",
            "--json",
            "-q",
        ]
        via_daemon = json.loads(
            run_cli(*args, env={"MLXBUN_DEFAULT_MODEL": str(tiny_model_dir)}).stdout
        )
        local = json.loads(
            run_cli(*args, "--local", env={"MLXBUN_DEFAULT_MODEL": str(tiny_model_dir)}).stdout
        )
        assert via_daemon["text"] == local["text"]
        assert via_daemon["seed"] == local["seed"] == 7
        banner = run_cli("generate", str(tiny_model_dir), "hi", "-n", "2")
        assert status["url"] in banner.stderr  # it said where it ran
        # and chat, piped
        chat = run_cli(
            "chat", str(tiny_model_dir), "-n", "6", "--seed", "3", "--temp", "0.7", input="hi\n"
        )
        chat_local = run_cli(
            "chat",
            str(tiny_model_dir),
            "-n",
            "6",
            "--seed",
            "3",
            "--temp",
            "0.7",
            "--local",
            input="hi\n",
        )
        assert chat.returncode == 0 and chat.stdout == chat_local.stdout
        logs = run_cli("daemon", "logs", "-n", "5")
        assert logs.returncode == 0 and logs.stdout.strip()
    finally:
        stop = run_cli("daemon", "stop")
    assert stop.returncode == 0 and "stopped" in stop.stdout
    assert not status_json()["running"]
    assert run_cli("daemon", "status").returncode == 1


def test_stale_state_file_is_detected_and_cleaned(isolated_home):
    state = isolated_home / "state"
    state.mkdir(parents=True)
    # A pid that cannot be alive.
    (state / "daemon.json").write_text(
        json.dumps(
            {
                "pid": 2**22 + 12345,
                "url": "http://127.0.0.1:1",
                "model": "demo",
                "started_at": time.time() - 100,
                "log": "x",
            }
        )
    )
    status = status_json()
    assert status == {"running": False, "stale_cleaned": True}
    assert not (state / "daemon.json").exists()
    assert "no daemon running" in run_cli("daemon", "stop").stdout


def test_dead_daemon_mid_use_gives_a_clear_message(tiny_model_dir, isolated_home):
    srv = start_server(tiny_model_dir, isolated_home)
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait()
    r = run_cli("generate", "hi", "--remote", srv.url, "-n", "3")
    assert r.returncode == 1
    assert "error:" in r.stderr and "Traceback" not in r.stderr


def test_api_key_required_everywhere_but_health(tiny_model_dir, tmp_path):
    srv = start_server(tiny_model_dir, tmp_path / "home", env={"MLXBUN_API_KEY": "s3cret"})
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/stats").status_code == 401
        ok = httpx.post(
            srv.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200
        # The CLI sends the key from the environment.
        r = run_cli(
            "generate", "hi", "--remote", srv.url, "-n", "2", "-q", env={"MLXBUN_API_KEY": "s3cret"}
        )
        assert r.returncode == 0, r.stderr
        r = run_cli("generate", "hi", "--remote", srv.url, "-n", "2", "-q")
        assert r.returncode == 2 and "API key" in r.stderr
        assert "s3cret" not in srv.output()
    finally:
        assert srv.stop() == 0


def test_sigterm_finishes_in_flight_stream_with_a_final_frame(
    tiny_model_dir, tmp_path, no_eos_bias
):
    srv = start_server(tiny_model_dir, tmp_path / "home", "--shutdown-grace", "1")
    frames: list[str] = []
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 100000,
        "stream": True,
        "temperature": 0,
        "logit_bias": no_eos_bias,
    }

    def consume() -> None:
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frames.append(line[6:])

    reader = threading.Thread(target=consume)
    reader.start()
    while len(frames) < 5:
        time.sleep(0.02)
    srv.proc.send_signal(signal.SIGTERM)
    reader.join(30)
    code = srv.proc.wait(30)
    assert code == 0, srv.output()
    assert frames[-1] == "[DONE]"
    last = json.loads(frames[-2])
    assert last["error"]["type"] == "server_shutdown"
