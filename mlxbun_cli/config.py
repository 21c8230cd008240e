"""Settings resolved flags > environment (MLXBUN_*) > config file > defaults.

Every value remembers where it came from, so `mlxbun config show` can say.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxbun_cli import paths
from mlxbun_cli.errors import InputError


@dataclass(frozen=True)
class SettingSpec:
    name: str
    type: type
    default: Any
    help: str
    secret: bool = False


SPECS: tuple[SettingSpec, ...] = (
    SettingSpec("default_model", str, None, "model used when none is named"),
    SettingSpec("host", str, "127.0.0.1", "address `serve` binds"),
    SettingSpec("port", int, 8080, "port `serve` listens on"),
    SettingSpec(
        "max_tokens", int, None, "default cap on generated tokens (unset: 8192 chat, 512 raw)"
    ),
    SettingSpec("prompt_cache_bytes", int, 1 << 30, "byte cap of the prompt-prefix KV cache"),
    SettingSpec("prompt_cache_entries", int, 16, "entry cap of the prompt-prefix KV cache"),
    SettingSpec("enable_thinking", bool, None, "server default for thinking (unset: model's)"),
    SettingSpec("api_key", str, None, "key every server route requires", secret=True),
    SettingSpec(
        "constrained_decoding", bool, True, "enforce response_format / grammar / tool_choice"
    ),
    SettingSpec(
        "compiled_decode", bool, True, "run one-token decode steps through mx.compile (faster)"
    ),
)
SPEC_BY_NAME = {spec.name: spec for spec in SPECS}


@dataclass(frozen=True)
class Setting:
    name: str
    value: Any
    source: str  # "flag", "env MLXBUN_X", "config <path>", "default"


def env_name(name: str) -> str:
    return "MLXBUN_" + name.upper()


def coerce(spec: SettingSpec, raw: Any, origin: str) -> Any:
    if raw is None:
        return None
    if spec.type is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise InputError(f"{spec.name} from {origin}: expected true/false, got {raw!r}")
    if spec.type is int:
        if isinstance(raw, bool):
            raise InputError(f"{spec.name} from {origin}: expected an integer, got {raw!r}")
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise InputError(
                f"{spec.name} from {origin}: expected an integer, got {raw!r}"
            ) from None
    return str(raw)


def read_config_file(path: Path | None = None) -> dict[str, Any]:
    path = path or paths.config_file()
    if not path.exists():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read config file {path}: {exc}") from exc
    unknown = sorted(set(data) - set(SPEC_BY_NAME))
    if unknown:
        raise InputError(
            f"config file {path}: unknown setting(s) {', '.join(unknown)}",
            hint="known settings: " + ", ".join(SPEC_BY_NAME),
        )
    return data


class Settings:
    """The settings in force, each with its source."""

    def __init__(self, flags: dict[str, Any] | None = None, config_path: Path | None = None):
        self._items: dict[str, Setting] = {}
        file_path = config_path or paths.config_file()
        file_values = read_config_file(file_path)
        flags = {k: v for k, v in (flags or {}).items() if v is not None}
        for spec in SPECS:
            if spec.name in flags:
                value, source = coerce(spec, flags[spec.name], "flag"), "flag"
            elif os.environ.get(env_name(spec.name)) not in (None, ""):
                origin = f"env {env_name(spec.name)}"
                value, source = coerce(spec, os.environ[env_name(spec.name)], origin), origin
            elif spec.name in file_values:
                origin = f"config {file_path}"
                value, source = coerce(spec, file_values[spec.name], origin), origin
            else:
                value, source = spec.default, "default"
            self._items[spec.name] = Setting(spec.name, value, source)

    def __getattr__(self, name: str) -> Any:
        items = self.__dict__.get("_items", {})
        if name in items:
            return items[name].value
        raise AttributeError(name)

    def items(self) -> list[Setting]:
        return list(self._items.values())

    def public_dict(self) -> dict[str, dict[str, Any]]:
        out = {}
        for item in self.items():
            value = item.value
            if SPEC_BY_NAME[item.name].secret and value is not None:
                value = "(set)"
            out[item.name] = {"value": value, "source": item.source}
        return out


def set_in_file(name: str, raw_value: str | None, path: Path | None = None) -> None:
    """Write (or with None, remove) one setting in the config file."""
    if name not in SPEC_BY_NAME:
        raise InputError(
            f"unknown setting '{name}'", hint="known settings: " + ", ".join(SPEC_BY_NAME)
        )
    path = path or paths.config_file()
    values = read_config_file(path)
    if raw_value is None:
        values.pop(name, None)
    else:
        values[name] = coerce(SPEC_BY_NAME[name], raw_value, "command line")
    paths.ensure(path.parent)
    tmp = path.with_suffix(".tmp")
    # 0600: the file may hold the API key.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(_dump_toml(values))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def _dump_toml(values: dict[str, Any]) -> str:
    import json

    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {json.dumps(str(value))}")
    return "\n".join(lines) + ("\n" if lines else "")
