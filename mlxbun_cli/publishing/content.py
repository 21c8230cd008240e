"""What a path holds, and the files a push sends from it.

- an adapter:  a folder with adapter_config.json + adapters.safetensors
- a model:     a folder with config.json + *.safetensors (quantized or not)
- a dataset:   a *.jsonl file, or a folder of them (every line a JSON value)

Models and adapters are pushed to model repos, datasets to dataset repos. From
a model or adapter folder every file is sent but hidden ones, training
checkpoints (`checkpoint/`, mlx-lm's numbered `NNNNNNN_adapters.safetensors`)
and half-written ones (`*.partial`, `*.tmp`, `*.incomplete`); from a dataset
folder, its *.jsonl files and README.md / LICENSE. Nothing here writes.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxbun_cli.errors import InputError

KINDS = ("model", "adapter", "dataset")
REPO_TYPES = {"model": "model", "adapter": "model", "dataset": "dataset"}
SKIP_DIRS = {"checkpoint", "__pycache__"}
SKIP_FILES = ("*.partial", "*.tmp", "*.incomplete", "*.lock", "[0-9]*_adapters.safetensors")
DATASET_EXTRAS = ("README.md", "LICENSE", "LICENSE.md", "LICENSE.txt")
MAX_FILES = 10_000  # a folder with more is not something to push by mistake
WHAT_FITS = (
    "push a model folder (config.json + *.safetensors), an adapter folder "
    "(adapter_config.json + adapters.safetensors), or *.jsonl data"
)


@dataclass(frozen=True)
class LocalFile:
    path_in_repo: str
    local: Path
    size: int


@dataclass
class Content:
    kind: str  # model | adapter | dataset
    root: Path  # the folder, or the .jsonl file itself
    files: list[LocalFile]
    config: dict[str, Any] = field(default_factory=dict)  # config.json / adapter_config.json
    row_counts: dict[str, int] = field(default_factory=dict)  # datasets: rows per *.jsonl

    @property
    def rows(self) -> int | None:
        return sum(self.row_counts.values()) if self.kind == "dataset" else None

    @property
    def repo_type(self) -> str:
        return REPO_TYPES[self.kind]

    @property
    def has_readme(self) -> bool:
        return any(f.path_in_repo == "README.md" for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def detect(path: Path) -> Content:
    """The content at `path`; InputError naming what is missing when it is none of them."""
    try:
        return _detect(Path(path).expanduser())
    except OSError as exc:  # a folder or file we may not read
        raise InputError(f"cannot read {exc.filename or path}: {exc.strerror or exc}") from None


def _detect(path: Path) -> Content:
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    path = path.resolve()
    if path.is_file():
        if path.suffix == ".jsonl":
            return _dataset(path, [_local(path, path.name)])
        raise InputError(f"{path} is not a model, adapter or dataset", hint=WHAT_FITS)
    if not path.is_dir():
        raise InputError(f"{path} is not a file or a folder")
    names = {p.name for p in path.iterdir() if p.is_file()}
    if "adapter_config.json" in names:
        if "adapters.safetensors" not in names:
            raise InputError(
                f"{path} has adapter_config.json but no adapters.safetensors",
                hint="is the fine-tune finished? `mlxbun jobs list` shows it",
            )
        return Content("adapter", path, _folder_files(path), _json(path / "adapter_config.json"))
    if "config.json" in names:
        if not any(fnmatch.fnmatch(n, "*.safetensors") for n in names):
            raise InputError(f"{path} has config.json but no *.safetensors weights", hint=WHAT_FITS)
        return Content("model", path, _folder_files(path), _json(path / "config.json"))
    data = [p for p in _walk(path) if p.suffix == ".jsonl" and p.is_file()]
    if data:
        files = [_local(p, p.relative_to(path).as_posix()) for p in data]
        extras = [_local(path / n, n) for n in DATASET_EXTRAS if (path / n).is_file()]
        return _dataset(path, files + extras)
    raise InputError(f"{path} holds no model, adapter or dataset", hint=WHAT_FITS)


def _dataset(root: Path, files: list[LocalFile]) -> Content:
    counts = {f.path_in_repo: count_rows(f.local) for f in files if f.local.suffix == ".jsonl"}
    if not sum(counts.values()):
        raise InputError(
            f"{root} has no rows to push", hint="a dataset is JSON Lines: one JSON value per line"
        )
    return Content("dataset", root, files, row_counts=counts)


def _local(path: Path, name: str) -> LocalFile:
    return LocalFile(name, path, path.stat().st_size)


def _walk(root: Path) -> Iterator[Path]:
    """The files under `root`, sorted, but hidden ones and SKIP_DIRS; at most MAX_FILES."""
    seen = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        for name in sorted(files):
            seen += 1
            if seen > MAX_FILES:
                raise InputError(
                    f"{root} has more than {MAX_FILES} files: not a model, adapter or dataset "
                    "folder",
                    hint=WHAT_FITS,
                )
            if not name.startswith("."):
                yield Path(folder) / name


def _folder_files(root: Path) -> list[LocalFile]:
    return [
        _local(path, path.relative_to(root).as_posix())
        for path in _walk(root)
        if path.is_file() and not any(fnmatch.fnmatch(path.name, p) for p in SKIP_FILES)
    ]


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a JSON object")
    return data


def count_rows(path: Path) -> int:
    """Rows in a JSON Lines file; InputError naming the first line that is not JSON."""
    rows = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    json.loads(line)
                except ValueError as exc:
                    raise InputError(
                        f"{path} line {number} is not JSON: {exc}",
                        hint="a dataset is JSON Lines: one JSON value per line",
                    ) from None
                rows += 1
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    return rows
