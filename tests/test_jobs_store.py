"""The job store (migrations, lifecycle, events) and each kind's parameter checks."""

from __future__ import annotations

import json
import os
import sqlite3
import threading

import pytest

from mlxbun_cli.errors import OptionError
from mlxbun_cli.jobs.params import QUANT_RECIPES, normalize
from mlxbun_cli.jobs.store import (
    MIGRATIONS,
    JobNotFoundError,
    JobStateError,
    JobStore,
    default_path,
)


def test_migrations_from_a_blank_database(tmp_path):
    path = tmp_path / "jobs.db"
    store = JobStore(path)
    names = [name for name, _ in MIGRATIONS]
    assert store.applied_migrations() == names == sorted(names)
    assert store.migrate() == []  # recorded: nothing runs twice
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        assert {"id", "kind", "params", "state", "progress", "output", "error"} <= columns
        assert {"created_at", "started_at", "finished_at", "attempt", "owner_pid"} <= columns
        events = {row[1] for row in conn.execute("PRAGMA table_info(events)")}
        assert events == {"job_id", "seq", "ts", "type", "data"}
    finally:
        conn.close()


def test_an_older_database_is_upgraded_in_order(tmp_path):
    path = tmp_path / "jobs.db"
    old = JobStore(path, migrate=False)
    assert old.migrate(upto=1) == [MIGRATIONS[0][0]]
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO jobs (id, kind, params, state, created_at) "
        "VALUES ('job_old', 'dataset', '{}', 'succeeded', 1.0)"
    )
    conn.commit()
    conn.close()
    assert JobStore(path).applied_migrations() == [name for name, _ in MIGRATIONS]
    job = JobStore(path).require("job_old")  # the row survived, with the new columns' defaults
    assert job.state == "succeeded" and job.attempt == 0 and not job.cancel_requested


def test_store_lives_in_the_data_dir(isolated_home):
    assert default_path() == isolated_home / "data" / "jobs.db"
    JobStore()
    assert (isolated_home / "data" / "jobs.db").is_file()


def test_job_lifecycle_and_events(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    job = store.create("dataset", {"input": "x"}, "/tmp/out.jsonl")
    assert job.id.startswith("job_") and job.state == "queued"
    assert job.created_at > 0 and job.started_at is None
    run = store.start_run(job.id, owner_pid=os.getpid())
    assert run is not None and run.state == "running" and run.attempt == 1
    assert store.start_run(job.id) is None  # only a queued job starts
    store.set_progress(job.id, {"done": 1, "total": 2}, attempt=1)
    store.add_event(job.id, "log", {"message": "hello"})
    assert not store.finish(job.id, "succeeded", attempt=2)  # a stale run cannot finish it
    assert store.finish(job.id, "succeeded", attempt=1)
    done = store.require(job.id)
    assert done.state == "succeeded" and done.progress == {"done": 1, "total": 2}
    assert done.finished_at >= done.started_at
    events = store.events(job.id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [(e.type, e.data.get("state")) for e in events] == [
        ("state", "queued"),
        ("state", "running"),
        ("progress", None),
        ("log", None),
        ("state", "succeeded"),
    ]
    assert [e.seq for e in store.events(job.id, after=3)] == [4, 5]
    assert store.resolve(job.id[:8]).id == job.id  # a unique prefix is enough
    with pytest.raises(JobNotFoundError):
        store.resolve("job_nope")


def test_cancel_resume_and_orphans(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    queued = store.create("dataset", {}, None)
    assert store.request_cancel(queued.id).state == "cancelled"  # at once: nothing ran
    with pytest.raises(JobStateError):
        store.request_cancel(queued.id)
    assert store.requeue(queued.id).state == "queued"
    running = store.create("dataset", {}, None)
    store.start_run(running.id, owner_pid=os.getpid())
    flagged = store.request_cancel(running.id)  # a running job is asked to stop
    assert flagged.state == "running" and flagged.cancel_requested
    with pytest.raises(JobStateError):
        store.requeue(running.id)
    # Jobs whose process is gone (a daemon killed mid-job) become interrupted; a job
    # "owned" by this very process too: a daemon starting afresh owns no work yet.
    dead = store.create("finetune", {}, None)
    store.start_run(dead.id, owner_pid=999_999)
    live = store.create("finetune", {}, None)
    store.start_run(live.id, owner_pid=4242)
    gone = store.mark_orphans_interrupted(alive=lambda pid: pid == 4242)
    assert sorted(gone) == sorted([running.id, dead.id])
    assert store.require(live.id).state == "running"
    assert store.require(dead.id).state == "interrupted"
    assert "resume" in (store.require(dead.id).error or "")
    assert store.requeue(dead.id).state == "queued"


def test_concurrent_writers_keep_event_order(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    job = store.create("dataset", {}, None)

    def write(n: int) -> None:
        for i in range(25):
            JobStore(tmp_path / "jobs.db").add_event(job.id, "log", {"writer": n, "i": i})

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [e.seq for e in store.events(job.id, limit=10_000)]
    assert seqs == list(range(1, 102))  # 1 state event + 100 logs, no gaps, no repeats


# -- parameter checks name the field ----------------------------------------------------------


def field_of(kind, params) -> str:
    with pytest.raises(OptionError) as info:
        normalize(kind, params)
    return info.value.field


def test_dataset_params(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "hi"}\n')
    params, output = normalize("dataset", {"input": str(source)})
    assert output == str(tmp_path / "in.out.jsonl") == params["output"]
    assert params["concurrency"] == 16 and params["defaults"] == {}
    assert field_of("nope", {}) == "kind"
    assert field_of("dataset", []) == "params"
    assert field_of("dataset", {}) == "params.input"
    assert field_of("dataset", {"input": str(tmp_path / "missing.jsonl")}) == "params.input"
    assert field_of("dataset", {"input": str(source), "output": str(source)}) == "params.output"
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root writes anywhere
            out = str(locked / "o.jsonl")
            assert field_of("dataset", {"input": str(source), "output": out}) == "params.output"
    finally:
        locked.chmod(0o700)
    assert field_of("dataset", {"input": str(source), "model": "no-such-model"}) == "params.model"
    assert field_of("dataset", {"input": str(source), "concurrency": 0}) == "params.concurrency"
    bad_defaults = {"input": str(source), "defaults": {"temperature": "hot"}}
    assert field_of("dataset", bad_defaults) == "params.defaults.temperature"
    assert field_of("dataset", {"input": str(source), "colour": 1}) == "params.colour"


def test_quantize_params(tiny_model_dir, isolated_home):
    params, output = normalize("quantize", {"model": str(tiny_model_dir), "group_size": 32})
    assert params["bits"] == 4 and params["name"] == "tiny-qwen3-4bit"
    assert output == str(isolated_home / "data" / "models" / "tiny-qwen3-4bit")
    model = str(tiny_model_dir)
    assert field_of("quantize", {}) == "params.model"
    assert field_of("quantize", {"model": "nope/nope"}) == "params.model"
    assert field_of("quantize", {"model": model, "bits": 7}) == "params.bits"
    assert field_of("quantize", {"model": model, "group_size": 128}) == "params.group_size"
    assert field_of("quantize", {"model": model, "recipe": "mixed_9_9"}) == "params.recipe"
    assert field_of("quantize", {"model": model, "name": "../escape"}) == "params.name"
    (isolated_home / "data" / "models" / "taken").mkdir(parents=True)
    assert field_of("quantize", {"model": model, "name": "taken"}) == "params.name"


def test_quant_recipes_match_mlx_lm():
    from mlx_lm.convert import QUANT_RECIPES as MLX_LM_RECIPES

    assert list(QUANT_RECIPES) == list(MLX_LM_RECIPES)


def test_finetune_params(tiny_model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(10)))
    params, output = normalize(
        "finetune", {"model": str(tiny_model_dir), "data": str(data), "output": str(tmp_path / "a")}
    )
    assert output == str(tmp_path / "a") and params["format"] == "text"
    assert params["num_layers"] == 2  # the tiny model's layer count, under the default 16
    base = {"model": str(tiny_model_dir), "data": str(data)}
    assert field_of("finetune", {**base, "batch_size": 10}) == "params.batch_size"  # 9 train rows
    assert field_of("finetune", {**base, "num_layers": 3}) == "params.num_layers"
    assert field_of("finetune", {**base, "learning_rate": 0}) == "params.learning_rate"
    assert field_of("finetune", {**base, "fine_tune_type": "full"}) == "params.fine_tune_type"
    assert field_of("finetune", {**base, "mask_prompt": True}) == "params.mask_prompt"
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": "a"}\n{"prompt": "q", "completion": "a"}\n')
    assert field_of("finetune", {**base, "data": str(mixed)}) == "params.data"
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\nnot json\n')
    assert field_of("finetune", {**base, "data": str(broken)}) == "params.data"
