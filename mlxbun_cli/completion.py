"""Values for shell completion: local model names, job ids, Hub repo ids.

Wire one into a parameter with Typer's `autocompletion=`:

    model: str = typer.Argument(..., autocompletion=complete_model)

Each function takes the word typed so far and returns `(value, help)` pairs
that start with it (zsh and fish show the help beside the value; bash shows
values only). They run at every <TAB> in a fresh process, so they import
nothing heavy (no mlx, huggingface_hub or server stack), read only small local
files, and never raise: a broken file means no candidates, not a traceback in
the user's shell.

- `complete_model`: ids `catalog.known_models()` finds (demo, registered,
  data dir, hub cache), with where each lives.
- `complete_job_id`: ids in the job store (`jobs.store`, SQLite, opened
  read-only), newest first, with kind and state.
- `complete_repo_id`: Hub repos pushed to before, newest first, from
  `data_dir/push_history.json`; `remember_repo_id` appends to it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

from mlxbun_cli import paths

Candidates = list[tuple[str, str]]
PUSH_HISTORY = "push_history.json"
PUSH_HISTORY_MAX = 50
_SOURCE_HELP = {
    "demo": "built-in demo model (random weights)",
    "registered": "registered directory",
    "data-dir": "made by mlxbun",
    "hf-cache": "Hugging Face cache",
}


def _safe(fn: Callable[[str], Candidates]) -> Callable[[str], Candidates]:
    @functools.wraps(fn)
    def wrapper(incomplete: str) -> Candidates:
        try:
            return [(v, h) for v, h in fn(incomplete or "") if v.startswith(incomplete or "")]
        except Exception:  # noqa: BLE001 - a completion must never print a traceback
            return []

    return wrapper


@_safe
def complete_model(incomplete: str) -> Candidates:
    """Local model ids: what `mlxbun models list` shows, without reading weights."""
    from mlxbun_cli.catalog import known_models

    return [(ref.id, _SOURCE_HELP.get(ref.source, ref.source)) for ref in known_models()]


@_safe
def complete_job_id(incomplete: str) -> Candidates:
    """Job ids, newest first, with kind and state as help; read-only, no migration."""
    import sqlite3

    from mlxbun_cli.jobs.store import default_path

    db = default_path()
    if not db.is_file():
        return []
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=0.2)
    try:
        rows = conn.execute(
            "SELECT id, kind, state FROM jobs ORDER BY created_at DESC LIMIT 200"
        ).fetchall()
    finally:
        conn.close()
    return [(str(job_id), f"{kind} {state}") for job_id, kind, state in rows]


def push_history_file() -> Path:
    return paths.data_dir() / PUSH_HISTORY


def _read_push_history() -> list[str]:
    try:
        data = json.loads(push_history_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [str(item) for item in data if isinstance(item, str)] if isinstance(data, list) else []


@_safe
def complete_repo_id(incomplete: str) -> Candidates:
    """Hub repo ids pushed to before, newest first."""
    return [(repo, "pushed before") for repo in _read_push_history()]


def remember_repo_id(repo_id: str) -> None:
    """Record a repo id `mlxbun push` used, so completion offers it next time."""
    history = [repo_id] + [r for r in _read_push_history() if r != repo_id]
    path = paths.ensure(paths.data_dir()) / PUSH_HISTORY
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(history[:PUSH_HISTORY_MAX], indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
