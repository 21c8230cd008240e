"""Which models are known locally, and how a name the user typed resolves to one.

Four places hold models, looked at in this order (the first of a name wins):

* the demo model, `demo`, always offered (built into the cache on first use);
* registered directories: `config_dir/models.json`, `{name: path}`, written by
  `mlxbun models add PATH`;
* `data_dir/models/NAME/`: models mlxbun made itself;
* the Hugging Face hub cache: `models--ORG--NAME/snapshots/REV/`, the snapshot
  `refs/main` points at, else the newest one with a config.json.

Import-light on purpose: shell completion and `models list` use it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Skipped:
    """A catalog entry that cannot be offered, and why."""

    id: str
    path: Path
    reason: str


@dataclass
class Scan:
    refs: list[ModelRef] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


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


def hf_repo_id(repo_dir: Path) -> str:
    """`models--org--name` -> `org/name` (a name of its own may contain `--`)."""
    return repo_dir.name[len("models--") :].replace("--", "/", 1)


def _hf_scan(scan: Scan) -> None:
    try:
        entries = sorted(hf_cache_dir().iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith("models--"):
            continue
        repo_id = hf_repo_id(entry)
        snapshot = _hf_snapshot(entry)
        if snapshot is not None:
            scan.refs.append(ModelRef(repo_id, snapshot, "hf-cache"))
        else:
            scan.skipped.append(
                Skipped(
                    repo_id, entry, "no snapshot with a readable config.json (broken download?)"
                )
            )


def hf_cached_models() -> list[ModelRef]:
    scan = Scan()
    _hf_scan(scan)
    return scan.refs


def data_dir_models() -> list[ModelRef]:
    root = paths.models_dir()
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    return [ModelRef(e.name, e, "data-dir") for e in entries if (e / "config.json").is_file()]


def registry_file() -> Path:
    return paths.config_dir() / "models.json"


def _read_registry() -> dict[str, str]:
    try:
        data = json.loads(registry_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_registry(data: dict[str, str]) -> None:
    path = paths.ensure(paths.config_dir()) / registry_file().name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def registered_models() -> list[ModelRef]:
    return [ModelRef(name, Path(path), "registered") for name, path in _read_registry().items()]


def register(path: Path, name: str | None = None) -> ModelRef:
    """Remember a model directory under a name (its folder name by default)."""
    path = path.expanduser().resolve()
    read_model_config(path)
    name = (name or path.name).strip()
    if not name or name == DEMO_ID or name.startswith((".", "/", "~")):
        raise InputError(f"'{name}' cannot name a model", hint="pick a plain name, e.g. my-model")
    registry = _read_registry()
    if registry.get(name) not in (None, str(path)):
        raise InputError(
            f"'{name}' is already registered for {registry[name]}",
            hint=f"pick another with --name, or `mlxbun models forget {name}` first",
        )
    registry[name] = str(path)
    _write_registry(registry)
    return ModelRef(name, path, "registered")


def unregister(name: str) -> ModelRef:
    """Forget a registered name; the directory itself is never touched."""
    registry = _read_registry()
    if name not in registry:
        known = ", ".join(sorted(registry)) or "none"
        raise ModelNotFoundError(f"no registered model named '{name}' (registered: {known})")
    path = registry.pop(name)
    _write_registry(registry)
    return ModelRef(name, Path(path), "registered")


def _demo_ref() -> ModelRef:
    return ModelRef(DEMO_ID, paths.demo_model_dir(), "demo")


def _first_of_each_id(refs: list[ModelRef]) -> list[ModelRef]:
    seen: set[str] = set()
    unique = []
    for ref in refs:
        if ref.id not in seen:
            seen.add(ref.id)
            unique.append(ref)
    return unique


def known_models() -> list[ModelRef]:
    """Every model found locally; the demo model is always offered."""
    return _first_of_each_id(
        [_demo_ref(), *registered_models(), *data_dir_models(), *hf_cached_models()]
    )


def scan() -> Scan:
    """`known_models`, plus the entries that cannot be used and why."""
    result = Scan(refs=[_demo_ref()])
    for ref in registered_models():
        if (ref.path / "config.json").is_file():
            result.refs.append(ref)
        else:
            result.skipped.append(Skipped(ref.id, ref.path, "registered path has no config.json"))
    result.refs.extend(data_dir_models())
    _hf_scan(result)
    result.refs = _first_of_each_id(result.refs)
    return result


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
    ref = find(name, default)
    return ensure_demo() if ref.is_demo else ref


def find(name: str | None, default: str | None = None) -> ModelRef:
    """`resolve` without building the demo model: for commands that only look."""
    name = (name or default or "").strip()
    if not name:
        raise InputError(
            "no model named and no default model configured",
            hint="name one (e.g. `mlxbun generate demo 'hi'`), or set one with "
            "`mlxbun config set default_model NAME`; `mlxbun models list` shows local models",
        )
    if name == DEMO_ID:
        return _demo_ref()
    candidate = Path(name).expanduser()
    if candidate.is_dir():
        read_model_config(candidate)
        return ModelRef(str(candidate.resolve()), candidate.resolve(), "path")
    if _looks_like_path(name) or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no such model directory: {name}")
    known = known_models()
    for ref in known:
        if ref.id == name:
            return ref
    matches = [ref for ref in known if name.lower() in ref.id.lower()]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise AmbiguousModelError(name, [m.id for m in matches])
    if name.count("/") == 1:
        hint = f"download it first: `mlxbun models pull {name}` (or pass a local directory)"
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


def removal_targets(ref: ModelRef) -> tuple[Path, ...]:
    """What `remove` deletes for a model in a cache mlxbun manages; raises for any other
    directory. A hub repo goes whole (every revision), with its lock folder."""
    if ref.source == "hf-cache" and ref.path.parent.parent.name.startswith("models--"):
        repo_dir = ref.path.parent.parent
        return (repo_dir, hf_cache_dir() / ".locks" / repo_dir.name)
    if ref.source in ("data-dir", "demo"):
        return (ref.path,)
    raise InputError(
        f"{ref.path} is not in a model cache mlxbun manages; it is left alone",
        hint="delete it yourself; `mlxbun models list` shows what rm can remove",
    )


def remove(ref: ModelRef) -> None:
    """Delete a cached model's files, or only forget a registered one."""
    if ref.source == "registered":
        unregister(ref.id)
        return
    for target in removal_targets(ref):
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
