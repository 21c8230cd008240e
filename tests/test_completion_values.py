"""Dynamic completion values: model names, job ids, repo ids.

The shell-level checks drive the `mlxbun` console script exactly as the bash
script does (see test_completions.py); the rest call the callbacks in process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_completions import COMPLETE_VAR, REPO, _env, _mlxbun_cmd, complete

from mlxbun_cli import catalog, completion, paths

HEAVY = ("mlx", "mlx_lm", "numpy", "huggingface_hub", "transformers", "httpx", "rich", "fastapi")


@pytest.fixture
def models(tmp_path, tiny_model_dir):
    """Two repos in the hub cache, laid out as huggingface_hub does, and a registered dir."""
    cache = catalog.hf_cache_dir()
    for repo_id in ("acme/alpha-4bit", "acme/beta"):
        repo = cache / ("models--" + repo_id.replace("/", "--"))
        snapshot = repo / "snapshots" / ("c" * 40)
        snapshot.mkdir(parents=True)
        (repo / "blobs").mkdir()
        (repo / "blobs" / "cfg").write_text(json.dumps({"model_type": "qwen3"}))
        (snapshot / "config.json").symlink_to("../../blobs/cfg")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("c" * 40)
    catalog.register(tiny_model_dir, "mine")
    return cache


def test_bash_completes_model_names(models):
    got = complete("bash", "mlxbun models show ")
    assert got == ["demo", "mine", "acme/alpha-4bit", "acme/beta"]
    assert complete("bash", "mlxbun models rm acme/b") == ["acme/beta"]
    assert complete("bash", "mlxbun models show zzz") == []


def test_zsh_shows_where_each_model_lives(models):
    env = _env(**{COMPLETE_VAR: "complete_zsh", "_TYPER_COMPLETE_ARGS": "mlxbun models show a"})
    proc = subprocess.run(_mlxbun_cmd(), capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert '"acme/alpha-4bit":"Hugging Face cache"' in proc.stdout


def test_model_completion_imports_nothing_heavy(models):
    """It runs at every <TAB>: mlx, the Hub client, the server stack stay out.
    (bash: zsh and fish load rich in Typer itself, to strip markup from help.)"""
    env = _env(
        **{COMPLETE_VAR: "complete_bash", "COMP_WORDS": "mlxbun\nmodels\nshow\n", "COMP_CWORD": "3"}
    )
    code = "import sys; sys.argv[0] = 'mlxbun'; from mlxbun_cli.app import main; main()"
    cmd = [sys.executable, "-X", "importtime", "-c", code]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "acme/beta" in proc.stdout.split()
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert not imported & set(HEAVY), imported & set(HEAVY)


def test_model_completion_survives_broken_files():
    paths.ensure(paths.config_dir())
    catalog.registry_file().write_text("{ not json")
    catalog.hf_cache_dir().mkdir(parents=True)
    (catalog.hf_cache_dir() / "models--x--y").write_text("a file where a dir should be")
    assert completion.complete_model("") == [("demo", "built-in demo model (random weights)")]


def test_job_ids_newest_first():
    from mlxbun_cli.jobs.store import JobStore

    assert completion.complete_job_id("") == []
    store = JobStore()
    first = store.create("quantize", {})
    second = store.create("dataset", {})
    assert completion.complete_job_id("") == [
        (second.id, "dataset queued"),
        (first.id, "quantize queued"),
    ]
    assert completion.complete_job_id(first.id[:-1]) == [(first.id, "quantize queued")]
    assert completion.complete_job_id("zzz") == []


def test_repo_ids_pushed_before():
    assert completion.complete_repo_id("") == []
    for repo in ("me/adapter", "me/quant", "me/adapter"):
        completion.remember_repo_id(repo)
    assert [v for v, _ in completion.complete_repo_id("")] == ["me/adapter", "me/quant"]
    assert [v for v, _ in completion.complete_repo_id("me/q")] == ["me/quant"]
    completion.push_history_file().write_text('{"not": "a list"}')
    assert completion.complete_repo_id("") == []
