"""Batch generation in process: `mlxbun generate --batch IN.jsonl -o OUT.jsonl`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, run_cli

from mlxbun_cli.jobs.dataset import errors_path, parse_input, repair


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def requests(n: int, max_tokens: int, bias: dict | None = None) -> list[dict]:
    """Half OpenAI batch lines (chat), half plain prompt lines (text completion)."""
    rows = []
    for i in range(n):
        if i % 2:
            body = {"messages": [{"role": "user", "content": f"Hello {i}"}]}
            body.update(max_tokens=max_tokens, **({"logit_bias": bias} if bias else {}))
            rows.append(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
        else:
            row = {
                "custom_id": f"req-{i}",
                "prompt": f"Once upon a time {i}",
                "max_tokens": max_tokens,
            }
            rows.append({**row, **({"logit_bias": bias} if bias else {})})
    return rows


def test_parse_input_lines_and_errors(tmp_path):
    source = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "hi"}]},
            },
            {"custom_id": "b", "url": "/v1/completions", "body": {"prompt": "once"}},
            {"messages": [{"role": "user", "content": "plain"}], "temperature": 0.5},
            {"prompt": "plain text"},
            "",
            "{not json",
            {"custom_id": "a", "prompt": "again"},
            {"custom_id": "c", "url": "/v1/embeddings", "body": {"input": "x"}},
            {"custom_id": "d", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x"}},
            {"custom_id": "e", "url": "/v1/chat/completions", "body": "hi"},
            {"custom_id": "f", "messages": [{"role": "robot", "content": "x"}]},
            {"custom_id": "g", "prompt": "x", "max_tokens": 0},
            {"custom_id": 7, "prompt": "x"},
            {"neither": True},
            [1, 2],
        ],
    )
    parsed = parse_input(source, {"max_tokens": 5})
    assert [(r.custom_id, r.url) for r in parsed.rows] == [
        ("a", "/v1/chat/completions"),
        ("b", "/v1/completions"),
        ("line-3", "/v1/chat/completions"),
        ("line-4", "/v1/completions"),
    ]
    assert all(r.request.max_tokens == 5 for r in parsed.rows)  # the job's defaults
    assert parsed.rows[2].request.temperature == 0.5  # a line's own field wins
    errors = {e.line: (e.param, e.message) for e in parsed.errors}
    assert sorted(errors) == [6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert "not valid JSON" in errors[6][1]
    assert errors[7] == ("custom_id", "duplicate custom_id 'a' (first on line 1)")
    assert errors[8][0] == "url" and errors[9][0] == "method" and errors[10][0] == "body"
    assert errors[11][0] == "messages[0].role" and errors[12][0] == "max_tokens"
    assert errors[13][0] == "custom_id"


def test_repair_cuts_a_torn_line(tmp_path):
    out = tmp_path / "out.jsonl"
    good = [{"custom_id": "a", "response": {}}, {"custom_id": "b", "response": {}}]
    out.write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in good)
        + b'{"custom_id": "a", "response": {}}\n{"custom_id": "c", "resp'
    )
    with open(out, "r+b") as handle:
        done, dropped = repair(handle)
    assert done == {"a", "b"} and dropped == 2  # the duplicate and the torn tail
    assert read_jsonl(out) == good
    assert out.read_bytes().endswith(b"\n")


def test_batch_in_process_with_bad_lines(tiny_model_dir, tmp_path):
    rows = requests(50, max_tokens=6)
    source = write_jsonl(
        tmp_path / "in.jsonl",
        [*rows[:25], "not json", *rows[25:], {"custom_id": "req-3", "prompt": "dup"}],
    )
    out = tmp_path / "out.jsonl"
    r = run_cli("generate", str(tiny_model_dir), "--batch", str(source), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    summary = json.loads(r.stdout)
    assert summary["state"] == "succeeded" and summary["where"] == "in process"
    assert summary["progress"]["done"] == summary["progress"]["total"] == 50
    assert summary["progress"]["invalid"] == 2
    results = read_jsonl(out)
    assert sorted(x["custom_id"] for x in results) == sorted(x["custom_id"] for x in rows)
    for result in results:
        assert result["id"].startswith("batch_req_") and result["error"] is None
        response = result["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        body = response["body"]
        chat = int(result["custom_id"].split("-")[1]) % 2 == 1
        assert body["object"] == ("chat.completion" if chat else "text_completion")
        assert body["model"] == str(tiny_model_dir.resolve())
        assert 1 <= body["usage"]["completion_tokens"] <= 6
        choice = body["choices"][0]
        assert isinstance(choice["message"]["content"] if chat else choice["text"], str)
    errors = read_jsonl(errors_path(out))
    assert [(e["line"], e["custom_id"]) for e in errors] == [(26, None), (52, "req-3")]
    assert all(e["response"] is None and e["error"]["message"] for e in errors)
    # The run is a job in the store: `jobs list` reads it with no daemon running.
    listed = json.loads(run_cli("jobs", "list", "--json").stdout)
    assert [(j["kind"], j["state"], j["output"]) for j in listed] == [
        ("dataset", "succeeded", str(out))
    ]
    job_id = listed[0]["id"]
    watched = run_cli("jobs", "watch", job_id)  # from the store: no daemon runs
    assert watched.returncode == 0 and "succeeded" in watched.stdout
    assert "50 requests, 0 already done, 50 to run" in run_cli("jobs", "logs", job_id).stdout
    # A rerun finds everything done and runs nothing.
    again = run_cli(
        "generate", str(tiny_model_dir), "--batch", str(source), "-o", str(out), "--json"
    )
    assert again.returncode == 0, again.stderr
    assert "50 requests, 50 already done, 0 to run" in again.stderr
    assert len(read_jsonl(out)) == 50
    removed = run_cli("jobs", "rm", job_id, "--outputs")
    assert removed.returncode == 0, removed.stderr
    assert not out.exists() and not errors_path(out).exists()
    assert [j["id"] for j in json.loads(run_cli("jobs", "list", "--json").stdout)] != [job_id]


def test_no_valid_lines_leaves_no_output(tiny_model_dir, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", ["nope", {"neither": 1}])
    out = tmp_path / "out.jsonl"
    r = run_cli("generate", str(tiny_model_dir), "--batch", str(source), "-o", str(out))
    assert r.returncode == 1
    assert "has no valid request lines (2 bad: line 1: not valid JSON" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()
    assert len(read_jsonl(errors_path(out))) == 2
    prompt_too = run_cli("generate", str(tiny_model_dir), "hi", "--batch", str(source))
    assert prompt_too.returncode == 2 and "drop the PROMPT" in prompt_too.stderr


def test_killed_batch_resumes_every_request_exactly_once(tiny_model_dir, tmp_path, no_eos_bias):
    rows = requests(60, max_tokens=48, bias=no_eos_bias)
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "mlxbun_cli", "generate", str(tiny_model_dir)]
    args += ["--batch", str(source), "-o", str(out), "--concurrency", "4", "-q"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 8:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the batch finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    written = out.read_bytes().count(b"\n")
    assert 8 <= written < 60
    with open(out, "ab") as handle:
        handle.write(
            b'{"id": "batch_req_x", "custom_id": "req-1", "resp'
        )  # torn, as a kill leaves it
    r = run_cli("generate", str(tiny_model_dir), "--batch", str(source), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert f"60 requests, {written} already done" in r.stderr
    assert "cut 1 broken line(s)" in r.stderr
    ids = [x["custom_id"] for x in read_jsonl(out)]
    assert sorted(ids) == sorted(x["custom_id"] for x in rows)  # every one exactly once
    assert all(x["response"]["body"]["usage"]["completion_tokens"] == 48 for x in read_jsonl(out))
    jobs = json.loads(run_cli("jobs", "list", "--json").stdout)
    assert [j["state"] for j in jobs] == ["succeeded", "interrupted"]  # the killed run, marked
