"""The only module that knows where mlxbun keeps its files.

`MLXBUN_HOME` puts everything under one folder (tests point it at a temp dir);
otherwise the platform's own locations from platformdirs are used.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "mlxbun"


def _home() -> Path | None:
    home = os.environ.get("MLXBUN_HOME")
    return Path(home).expanduser() if home else None


def _dir(kind: str) -> Path:
    home = _home()
    if home is not None:
        return home / kind
    import platformdirs

    getter = {
        "config": platformdirs.user_config_dir,
        "data": platformdirs.user_data_dir,
        "cache": platformdirs.user_cache_dir,
        "state": platformdirs.user_state_dir,
        "logs": platformdirs.user_log_dir,
    }[kind]
    return Path(getter(APP_NAME, appauthor=False))


def config_dir() -> Path:
    return _dir("config")


def data_dir() -> Path:
    return _dir("data")


def cache_dir() -> Path:
    return _dir("cache")


def state_dir() -> Path:
    return _dir("state")


def log_dir() -> Path:
    return _dir("logs")


def config_file() -> Path:
    return config_dir() / "config.toml"


def history_file() -> Path:
    return data_dir() / "chat_history"


def models_dir() -> Path:
    """Models mlxbun made itself (quantized, demo)."""
    return data_dir() / "models"


def demo_model_dir() -> Path:
    return cache_dir() / "demo-model"


def ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def all_locations() -> dict[str, Path]:
    return {
        "config": config_dir(),
        "data": data_dir(),
        "cache": cache_dir(),
        "state": state_dir(),
        "logs": log_dir(),
    }
