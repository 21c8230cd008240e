"""Shared fixtures: a tiny real model built once, and a private MLXBUN_HOME per test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """No test touches the real home: config, data, caches and the HF cache are temp."""
    home = tmp_path / "mlxbun-home"
    monkeypatch.setenv("MLXBUN_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    for name in list(os.environ):
        if name.startswith("MLXBUN_") and name != "MLXBUN_HOME":
            monkeypatch.delenv(name)
    return home


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from mlxbun_cli.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", size="tiny")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir):
    """The tiny model loaded once per session, with its scheduler."""
    from mlxbun_cli.catalog import ModelRef
    from mlxbun_cli.engine.loader import load_model

    loaded = load_model(ModelRef("tiny", tiny_model_dir, "path"))
    yield loaded
    loaded.close()


def run_cli(*args: str, input: str | None = None, env: dict | None = None, timeout: float = 120):
    """Run the real `mlxbun` entry point in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mlxbun_cli", *args],
        input=input,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=REPO,
    )


@pytest.fixture(scope="session")
def server(tiny_model_dir, tmp_path_factory):
    """One real `mlxbun serve` subprocess for the session, on a free loopback port."""
    from serverutil import start_server

    srv = start_server(tiny_model_dir, tmp_path_factory.mktemp("server-home"))
    yield srv
    code = srv.stop()
    assert code == 0, srv.output()


@pytest.fixture
def openai_client(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="session")
def no_eos_bias(tiny_model_dir):
    """Random weights may emit EOS anywhere; tests that need length forbid it."""
    import json

    ids = json.loads((tiny_model_dir / "generation_config.json").read_text())["eos_token_id"]
    return {str(i): -100 for i in ids}
