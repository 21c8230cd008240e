"""Which models are known locally, and how a name the user typed resolves to one.

Import-light on purpose: shell completion and `models list` use it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mlxbun_cli import paths
from mlxbun_cli.errors import (
    AmbiguousModelError,
    InputError,
    InvalidModelError,
    ModelNotFoundError,
)

DEMO_ID = "demo"


@dataclass(frozen=True)
class ModelRef:
    id: str  # what the user and the API call it
    path: Path  # a directory with config.json
    source: str  # "demo", "hf-cache", "data-dir", "path", "registered"

    @property
    def is_demo(self) -> bool:
        return self.source == "demo"


def hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def _hf_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot `refs/main` points at, else the newest one with a config."""
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    try:
        if ref.is_file():
            candidate = snapshots / ref.read_text().strip()
            if (candidate / "config.json").is_file():
                return candidate
        found = [s for s in snapshots.iterdir() if (s / "config.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda s: s.stat().st_mtime) if found else None


def hf_cached_models() -> list[ModelRef]:
    root = hf_cache_dir()
    refs = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith("models--"):
            continue
        snapshot = _hf_snapshot(entry)
        if snapshot is not None:
            repo_id = entry.name[len("models--") :].replace("--", "/", 1)
            refs.append(ModelRef(repo_id, snapshot, "hf-cache"))
    return refs


def data_dir_models() -> list[ModelRef]:
    root = paths.models_dir()
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    return [ModelRef(e.name, e, "data-dir") for e in entries if (e / "config.json").is_file()]


def registry_file() -> Path:
    return paths.config_dir() / "models.json"


def registered_models() -> list[ModelRef]:
    try:
        data = json.loads(registry_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    refs = []
    for name, path in data.items() if isinstance(data, dict) else []:
        refs.append(ModelRef(str(name), Path(path), "registered"))
    return refs


def known_models() -> list[ModelRef]:
    """Every model found locally; the demo model is always offered."""
    refs = [ModelRef(DEMO_ID, paths.demo_model_dir(), "demo")]
    seen = {DEMO_ID}
    for ref in registered_models() + data_dir_models() + hf_cached_models():
        if ref.id not in seen:
            seen.add(ref.id)
            refs.append(ref)
    return refs


def read_model_config(path: Path) -> dict:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise InvalidModelError(
            f"{path} is not a model directory: it has no config.json",
            hint="a model directory holds config.json, tokenizer files and *.safetensors",
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidModelError(f"{config_path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise InvalidModelError(f"{config_path} has no model_type: not a model config")
    return config


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and Path(name).exists()


def resolve(name: str | None, default: str | None = None) -> ModelRef:
    """Turn what the user typed into a model directory, or say clearly why not."""
    name = (name or default or "").strip()
    if not name:
        raise InputError(
            "no model named and no default model configured",
            hint="name one (e.g. `mlxbun generate demo 'hi'`), or set one with "
            "`mlxbun config set default_model NAME`; `mlxbun models list` shows local models",
        )
    if name == DEMO_ID:
        return ensure_demo()
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        read_model_config(candidate)
        return ModelRef(str(candidate.resolve()), candidate.resolve(), "path")
    if _looks_like_path(name) or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no such model directory: {name}")
    known = known_models()
    for ref in known:
        if ref.id == name:
            return ensure_demo() if ref.is_demo else ref
    matches = [ref for ref in known if name.lower() in ref.id.lower()]
    if len(matches) == 1:
        ref = matches[0]
        return ensure_demo() if ref.is_demo else ref
    if len(matches) > 1:
        raise AmbiguousModelError(name, [m.id for m in matches])
    if name.count("/") == 1:
        hint = f"download it first: `hf download {name}` (or pass a local directory)"
    else:
        hint = "`mlxbun models list` shows local models; `demo` is always available"
    raise ModelNotFoundError(f"no local model matches '{name}'", hint=hint)


def ensure_demo() -> ModelRef:
    """The built-in random-weight demo model, built into the cache on first use."""
    target = paths.demo_model_dir()
    if not (target / "model.safetensors").is_file():
        from mlxbun_cli.demo_model import build_demo_model

        build_demo_model(target)
    return ModelRef(DEMO_ID, target, "demo")
