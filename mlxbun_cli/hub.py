"""Downloading models from the Hugging Face Hub into its standard cache.

`pull` calls huggingface_hub's `snapshot_download` with only the files an MLX
model needs (config, safetensors weights, tokenizer, templates), into the same
cache `catalog` reads (`HF_HUB_CACHE`), so a pulled model is listed and
resolvable at once. Downloads resume where they stopped (huggingface_hub keeps
`.incomplete` blobs). Its errors become one readable `MlxbunError` each.

huggingface_hub is imported inside the functions: it is slow to import.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxbun_cli import catalog
from mlxbun_cli.errors import InputError, InvalidModelError, MlxbunError

if TYPE_CHECKING:
    from rich.progress import Progress

# What mlx-lm loads: weights, configs, tokenizer files (BPE json, sentencepiece
# models, tiktoken ranks, vocab/merges text), chat templates.
ALLOW_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer*",
    "*.jinja",
    "*.txt",
    "*.model",
    "*.tiktoken",
]
# Other frameworks' weights that match the patterns above in some repos.
IGNORE_PATTERNS = ["*.bin", "*.pth", "*.pt", "*.gguf", "*.onnx", "*.onnx_data", "onnx/*", "*.h5"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class PullResult:
    repo_id: str
    revision: str
    path: Path  # the snapshot directory
    files: int
    bytes: int


def check_repo_id(repo_id: str) -> str:
    repo_id = repo_id.strip()
    if not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith(".git"):
        raise InputError(
            f"'{repo_id}' is not a Hub repo id",
            hint="repo ids look like ORG/NAME, e.g. mlx-community/Qwen3-0.6B-4bit",
        )
    return repo_id


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def pull(repo_id: str, revision: str | None = None, *, tqdm_class: Any = None) -> PullResult:
    """Download (or finish downloading) REPO_ID into the hub cache."""
    repo_id = check_repo_id(repo_id)
    revision = revision or "main"
    from huggingface_hub import snapshot_download

    try:  # offline, it answers from the cache when the snapshot there is complete
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=catalog.hf_cache_dir(),
            endpoint=endpoint(),
            allow_patterns=ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
            tqdm_class=tqdm_class,
        )
    except Exception as exc:
        raise _hub_error(exc, repo_id, revision) from exc
    path = Path(folder)
    try:
        catalog.read_model_config(path)
    except InvalidModelError as exc:
        raise InvalidModelError(
            f"downloaded {repo_id}, but it is not a model: {exc.message}",
            hint=f"`mlxbun models rm {repo_id}` removes it again",
        ) from exc
    files = [p for p in path.rglob("*") if p.is_file()]
    return PullResult(repo_id, revision, path, len(files), sum(p.stat().st_size for p in files))


def _hub_error(exc: Exception, repo_id: str, revision: str) -> Exception:
    """huggingface_hub's exceptions -> the most specific one-line error we have."""
    from huggingface_hub import constants, errors

    where = endpoint()
    if isinstance(exc, errors.GatedRepoError):
        return MlxbunError(
            f"{repo_id} is gated: accept its terms on the Hub, then log in",
            hint=f"open {where}/{repo_id}, then `hf auth login` or set HF_TOKEN",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return InputError(
            f"no repo {repo_id} on {where} (or it is private and you are not logged in)",
            hint="check the spelling; for a private repo, `hf auth login` or set HF_TOKEN",
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return InputError(f"{repo_id} has no revision '{revision}'")
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return MlxbunError(
                f"the Hub refused access to {repo_id} ({status}): authentication required",
                hint="`hf auth login` or set HF_TOKEN",
            )
        return MlxbunError(f"the Hub answered {status} for {repo_id}: {_first_line(exc)}")
    if isinstance(exc, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
        if constants.is_offline_mode():
            return MlxbunError(
                f"cannot download {repo_id}: offline mode is on (HF_HUB_OFFLINE)",
                hint="set HF_HUB_OFFLINE=0 to download; models already cached work offline",
            )
        return MlxbunError(
            f"cannot reach the Hugging Face Hub at {where} to download {repo_id}",
            hint="check the network (or HF_ENDPOINT); a partial download resumes next time",
        )
    if isinstance(exc, ValueError):  # e.g. a revision name the Hub client rejects
        return InputError(f"cannot download {repo_id}: {_first_line(exc)}")
    # Disk full, a proxy refusing, a connection cut mid-file: resumable next time.
    return MlxbunError(
        f"download of {repo_id} failed: {type(exc).__name__}: {_first_line(exc)}",
        hint="run the same command again to resume",
    )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def rich_tqdm(progress: Progress) -> type:
    """A tqdm class that draws into a rich Progress, for snapshot_download's bars.

    snapshot_download makes one bar counting files and two counting bytes (network
    transfer and bytes written; for plain HTTP downloads they are the same): the
    transfer one is not drawn.
    """
    import io

    from tqdm.std import tqdm

    class RichTqdm(tqdm):
        _task: Any = None  # tqdm's __init__ already refreshes
        _bytes = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            kwargs["file"] = io.StringIO()
            kwargs["disable"] = False
            kwargs["mininterval"] = 0
            super().__init__(*args, **kwargs)
            desc = str(kwargs.get("desc") or "")
            if not desc.startswith("Downloading bytes"):
                self._bytes = kwargs.get("unit") == "B"
                self._task = progress.add_task(
                    self._label(desc), total=self.total or None, unit="B" if self._bytes else ""
                )
                self._push()

        def _label(self, desc: str) -> str:
            return "downloading" if self._bytes else desc.lower() or "files"

        def _push(self) -> None:
            if self._task is not None:
                progress.update(self._task, completed=self.n, total=self.total or None)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            self._push()
            return shown

        def refresh(self, *args: Any, **kwargs: Any) -> None:
            self._push()

        def display(self, *args: Any, **kwargs: Any) -> None:
            pass

        def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
            if self._task is not None and not self._bytes:
                progress.update(self._task, description=(desc or "").lower())

        set_description_str = set_description

    return RichTqdm
