"""Quantize and fine-tune jobs: a JobManager here, real worker processes under it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from conftest import run_cli
from serverutil import start_server

from mlxbun_cli.jobs.manager import JobManager
from mlxbun_cli.jobs.store import JobStore

QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."


@pytest.fixture
def manager(isolated_home):
    jobs = JobManager(JobStore(), kill_grace=20)
    jobs.start()
    yield jobs
    jobs.stop(timeout=30)


def wait(manager: JobManager, job_id: str, check, timeout: float = 240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = manager.store.require(job_id)
        if check(job):
            return job
        time.sleep(0.05)
    raise AssertionError(f"timed out; job is {manager.store.require(job_id)}")


def finished(job) -> bool:
    return job.finished


def test_quantize_writes_a_model_generate_loads(manager, tiny_model_dir, isolated_home):
    job = manager.submit("quantize", {"model": str(tiny_model_dir), "bits": 4, "group_size": 32})
    done = wait(manager, job.id, finished)
    assert done.state == "succeeded", (done.error, log_of(done.id))
    target = isolated_home / "data" / "models" / "tiny-qwen3-4bit"
    assert done.output == str(target)
    config = json.loads((target / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    card = (target / "README.md").read_text()
    for text in (str(tiny_model_dir), "| bits | 4 |", "| group size | 32 |", "| mlxbun | 0.1.0 |"):
        assert text in card
    assert time.strftime("%Y-%m-%d") in card
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no half-written dirs
    stages = [e.data["stage"] for e in manager.store.events(job.id) if e.type == "progress"]
    assert stages[-1] == "done" and "quantizing" in stages
    r = run_cli("generate", "tiny-qwen3-4bit", "hello", "-n", "5", "--json", "-q", "--local")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["usage"]["completion_tokens"] >= 1
    # The same name again is refused before anything runs.
    with pytest.raises(Exception, match="already exists"):
        manager.submit("quantize", {"model": str(tiny_model_dir), "group_size": 32})


def test_mixed_recipe(manager, tiny_model_dir, isolated_home):
    params = {"model": str(tiny_model_dir), "recipe": "mixed_3_6", "group_size": 32}
    job = manager.submit("quantize", params)
    done = wait(manager, job.id, finished)
    assert done.state == "succeeded", (done.error, log_of(done.id))
    config = json.loads((Path(done.output) / "config.json").read_text())
    layer_bits = {v["bits"] for v in config["quantization"].values() if isinstance(v, dict)}
    assert layer_bits == {3, 6}


def log_of(job_id: str) -> str:
    from mlxbun_cli.jobs.manager import job_log_file

    path = job_log_file(job_id)
    return path.read_text()[-3000:] if path.exists() else ""


def test_finetune_cancel_resume_and_the_adapter_loads(manager, tiny_model_dir, tmp_path):
    rows = [
        {
            "messages": [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": ANSWER},
            ]
        }
    ] * 16
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    adapter = tmp_path / "adapter"
    params = {
        "model": str(tiny_model_dir),
        "data": str(data),
        "output": str(adapter),
        "iters": 60,
        "batch_size": 4,
        "learning_rate": 1e-3,
        "save_every": 10,
        "report_every": 10,
    }
    job = manager.submit("finetune", params)
    wait(manager, job.id, lambda j: j.progress.get("done", 0) >= 20 or j.finished)
    manager.cancel(job.id)
    stopped = wait(manager, job.id, finished, timeout=60)
    assert stopped.state == "cancelled", (stopped.error, log_of(job.id))
    step = json.loads((adapter / "checkpoint" / "state.json").read_text())["step"]
    assert 20 <= step < 60 and stopped.progress["done"] == step
    assert (adapter / "checkpoint" / "optimizer.safetensors").is_file()

    manager.resume(job.id)
    done = wait(manager, job.id, finished)
    assert done.state == "succeeded", (done.error, log_of(job.id))
    assert done.attempt == 2 and done.progress["done"] == 60
    events = manager.store.events(job.id, limit=10_000)
    resumed_at = next(i for i, e in enumerate(events) if e.data.get("start_step") == step)
    after = [e.data["step"] for e in events[resumed_at:] if e.type == "train"]
    assert after and after[0] > step  # it went on from the checkpoint, not from zero
    losses = [e.data["loss"] for e in events if e.type == "train"]
    assert losses[-1] < 0.5 * losses[0], losses  # it learned
    assert {p.name for p in adapter.iterdir()} == {
        "adapters.safetensors",
        "adapter_config.json",
        "README.md",
    }
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "lora" and config["lora_parameters"]["rank"] == 8

    args = ["generate", str(tiny_model_dir), QUESTION, "-n", "16", "--temp", "0", "--no-think"]
    tuned = run_cli(*args, "--adapter", str(adapter), "--json", "-q")
    assert tuned.returncode == 0, tuned.stderr
    assert json.loads(tuned.stdout)["text"] == ANSWER
    base = run_cli(*args, "--json", "-q")
    assert json.loads(base.stdout)["text"] != ANSWER

    # `serve --adapter` (isolated workers, the default) serves the tuned model.
    srv = start_server(tiny_model_dir, tmp_path / "serve-home", "--adapter", str(adapter))
    try:
        reply = httpx.post(
            srv.url + "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": 16,
                "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False},
            },
            timeout=60,
        )
        assert reply.json()["choices"][0]["message"]["content"] == ANSWER
    finally:
        srv.stop()


def test_dora_with_validation(manager, tiny_model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"text": f"row {i % 3} of the data"}) + "\n" for i in range(8))
    )
    params = {
        "model": str(tiny_model_dir),
        "data": str(data),
        "output": str(tmp_path / "dora"),
        "fine_tune_type": "dora",
        "iters": 4,
        "batch_size": 2,
        "valid_ratio": 0.25,
        "steps_per_eval": 2,
    }
    job = manager.submit("finetune", params)
    done = wait(manager, job.id, finished)
    assert done.state == "succeeded", (done.error, log_of(job.id))
    kinds = {e.type for e in manager.store.events(job.id)}
    assert {"train", "val", "output"} <= kinds
    assert (
        json.loads((tmp_path / "dora" / "adapter_config.json").read_text())["fine_tune_type"]
        == "dora"
    )


def test_a_killed_worker_fails_the_job_with_a_reason(manager, tiny_model_dir, tmp_path):
    import os
    import signal

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(8)))
    params = {"model": str(tiny_model_dir), "data": str(data), "iters": 5000, "batch_size": 2}
    job = manager.submit("finetune", {**params, "output": str(tmp_path / "a")})
    running = wait(manager, job.id, lambda j: j.progress.get("done", 0) >= 1 or j.finished)
    assert running.state == "running" and running.owner_pid
    os.kill(running.owner_pid, signal.SIGKILL)
    failed = wait(manager, job.id, finished, timeout=60)
    assert failed.state == "failed" and "signal 9" in failed.error
