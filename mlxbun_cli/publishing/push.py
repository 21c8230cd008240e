"""Push a model, an adapter or a dataset to the Hub: plan (local), then execute.

`plan` checks everything it can without the network: the repo id (huggingface_hub's
own validator), the job (it exists, has succeeded, is of the kind asked for) or the
path, what the content is, and the card to generate. `execute` then:

1. creates the repo when missing (`create_repo(exist_ok=True)`; `private` applies
   only to a new repo) and reads its head commit;
2. pre-uploads the files (`preupload_lfs_files`: large files go to LFS / Xet storage,
   small ones are sent inline with the commit);
3. makes one commit (`create_commit`) with every file plus the generated README.md.

huggingface_hub leaves files the Hub already has out of the commit, and makes no
commit at all when nothing changed (it returns the head instead); a head that did
not move is reported as `up_to_date`. A cancel (the `cancelled` event) is honoured
between the steps, so a push stopped before step 3 publishes nothing.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxbun_cli.errors import InputError, MlxbunError
from mlxbun_cli.publishing import cards, hubapi
from mlxbun_cli.publishing.content import Content, detect

if TYPE_CHECKING:
    from mlxbun_cli.jobs.store import Job
    from mlxbun_cli.publishing.credentials import Credential

# What each job kind's output is.
JOB_CONTENT = {"quantize": "model", "finetune": "adapter", "dataset": "dataset"}
_HF_CACHE_DIR = re.compile(r"^(models|datasets)--([\w.-]+)--([\w.-]+)$")

Stage = Callable[[str, str], None]


class PushCancelled(MlxbunError):
    def __init__(self) -> None:
        super().__init__("the push was cancelled before its commit; nothing was published")


@dataclass(frozen=True)
class PlannedFile:
    path_in_repo: str
    size: int
    local: Path | None  # None: generated (the card)

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path_in_repo,
            "size": self.size,
            "source": str(self.local) if self.local else "generated",
        }


@dataclass
class PushPlan:
    repo_id: str
    private: bool
    content: Content
    card: str | None  # the generated README.md; None when the folder has its own
    provenance: cards.Provenance

    @property
    def job_id(self) -> str | None:
        return self.provenance.job_id

    def card_for(self, repo_id: str) -> str | None:
        """The card naming `repo_id` (a bare NAME becomes USER/NAME once the Hub says)."""
        if self.card is None or repo_id == self.repo_id:
            return self.card
        return cards.render(self.content, repo_id, self.provenance)

    @property
    def kind(self) -> str:
        return self.content.kind

    @property
    def repo_type(self) -> str:
        return self.content.repo_type

    @property
    def files(self) -> list[PlannedFile]:
        out = [PlannedFile(f.path_in_repo, f.size, f.local) for f in self.content.files]
        if self.card is not None:
            out.append(PlannedFile("README.md", len(self.card.encode()), None))
        return out

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "dry_run": True,
            "repo_id": self.repo_id,
            "repo_type": self.repo_type,
            "kind": self.kind,
            "private": self.private,
            "job_id": self.job_id,
            "source": str(self.content.root),
            "files": [f.as_dict() for f in self.files],
            "total_bytes": self.total_bytes,
            "rows": self.content.rows,
            "card": self.card,
        }


@dataclass(frozen=True)
class PushResult:
    url: str
    repo_id: str
    repo_type: str
    kind: str
    files: list[str]
    commit: str | None
    up_to_date: bool  # nothing changed: no commit was made
    private_ignored: bool  # --private asked for, but the repo already existed public

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "url": self.url,
            "repo_id": self.repo_id,
            "repo_type": self.repo_type,
            "kind": self.kind,
            "files": self.files,
            "commit": self.commit,
            "up_to_date": self.up_to_date,
        }


# -- plan (no network) -----------------------------------------------------------------


def pushable_job(job_id: str, kind: str | None = None) -> Job:
    """A job whose output can be pushed: it exists, is of `kind`, and has succeeded."""
    from mlxbun_cli.jobs.store import JobNotFoundError, JobStore, default_path

    if not default_path().exists():
        raise JobNotFoundError(job_id)
    job = JobStore().resolve(job_id)
    if kind is not None and job.kind != kind:
        raise InputError(f"job {job.id} is a {job.kind} job, not a {kind} job")
    if job.state != "succeeded":
        raise InputError(
            f"job {job.id} is {job.state}: only a succeeded job can be pushed",
            hint=f"`mlxbun jobs show {job.id}` says how it stands",
        )
    if not job.output:
        raise InputError(f"job {job.id} has no output to push")
    return job


def plan(
    repo_id: str,
    *,
    source_path: str | Path | None = None,
    job_id: str | None = None,
    private: bool = False,
    kind: str | None = None,
) -> PushPlan:
    """Everything a push will send, checked locally; `kind` is the job kind asked for."""
    repo_id = hubapi.check_repo_id(repo_id)
    if (source_path is None) == (job_id is None):
        raise InputError("give a PATH or --job ID to push (one of them)")
    job = pushable_job(job_id, kind) if job_id is not None else None
    path = Path(job.output if job is not None and job.output else str(source_path))
    content = detect(path)
    expected = JOB_CONTENT.get(job.kind if job is not None else (kind or ""))
    if expected and content.kind != expected:
        whose = f"job {job.id}'s output " if job is not None else ""
        raise InputError(f"{whose}{content.root} is {_a(content.kind)}, not {_a(expected)}")
    prov = cards.Provenance(
        made=(job.finished_at if job is not None and job.finished_at else _newest(content)),
        job_id=job.id if job is not None else None,
        job_kind=job.kind if job is not None else None,
        params=dict(job.params) if job is not None else {},
        base_model=_cache_repo_id(content.root),
    )
    card = None if content.has_readme else cards.render(content, repo_id, prov)
    return PushPlan(repo_id, private, content, card, prov)


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _newest(content: Content) -> float:
    return max((f.local.stat().st_mtime for f in content.files), default=0.0)


def _cache_repo_id(path: Path) -> str | None:
    """ORG/NAME when `path` is a snapshot in the Hugging Face cache."""
    for part in path.parts:
        if match := _HF_CACHE_DIR.match(part):
            return f"{match[2]}/{match[3]}"
    return None


# -- execute ------------------------------------------------------------------------------


class _QuietNoChange(logging.Filter):
    """huggingface_hub warns when a commit has nothing to change; the push reports it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "No files have been modified" not in record.getMessage()


def execute(
    p: PushPlan,
    credential: Credential,
    on_stage: Stage | None = None,
    cancelled: threading.Event | None = None,
) -> PushResult:
    from huggingface_hub import CommitOperationAdd

    from mlxbun_cli import __version__
    from mlxbun_cli.render import human_bytes

    api = hubapi.client(credential.token)
    stage = on_stage or (lambda name, detail: None)
    repo_id = p.repo_id

    def call(doing: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if cancelled is not None and cancelled.is_set():
            raise PushCancelled()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise hubapi.hub_error(exc, doing, repo_id, credential.describe()) from exc

    stage("repo", f"{p.repo_type} repo {repo_id}")
    private = True if p.private else None  # None: the namespace's default
    kind = {"repo_type": p.repo_type}
    url = call("create the repo", api.create_repo, repo_id, private=private, exist_ok=True, **kind)
    repo_id = getattr(url, "repo_id", None) or repo_id  # NAME alone lands in the user's namespace
    info = call("read the repo", api.repo_info, repo_id, **kind)
    head = getattr(info, "sha", None)
    try:
        ops = [CommitOperationAdd(f.path_in_repo, str(f.local)) for f in p.content.files]
    except ValueError as exc:  # a file removed since the plan was made
        raise InputError(f"cannot push {p.content.root}: {hubapi.first_line(exc)}") from None
    card = p.card_for(repo_id)
    if card is not None:
        ops.append(CommitOperationAdd("README.md", card.encode()))
    stage("upload", f"{len(ops)} files, {human_bytes(p.total_bytes)}")
    call("upload the files", api.preupload_lfs_files, repo_id, ops, free_memory=False, **kind)
    stage("commit", "one commit")
    message = f"Upload {p.kind} with mlxbun"
    quiet = _QuietNoChange()
    logging.getLogger("huggingface_hub.hf_api").addFilter(quiet)
    try:
        commit = call(
            "commit the files",
            api.create_commit,
            repo_id,
            ops,
            commit_message=message,
            commit_description=_description(p, __version__),
            **kind,
        )
    finally:
        logging.getLogger("huggingface_hub.hf_api").removeFilter(quiet)
    oid = getattr(commit, "oid", None)
    return PushResult(
        url=str(url),
        repo_id=repo_id,
        repo_type=p.repo_type,
        kind=p.kind,
        files=[op.path_in_repo for op in ops],
        commit=oid,
        up_to_date=head is not None and oid == head,
        private_ignored=bool(p.private and not getattr(info, "private", True)),
    )


def _description(p: PushPlan, version: str) -> str:
    from mlxbun_cli.render import human_bytes

    made = f" from job {p.job_id}" if p.job_id else ""
    return f"{len(p.files)} files, {human_bytes(p.total_bytes)}{made}; pushed by mlxbun {version}."


# -- the daemon's entry -----------------------------------------------------------------------


def publish(
    *,
    kind: str,
    repo_id: str,
    job_id: str | None = None,
    source_path: str | None = None,
    private: bool | None = None,
    cancelled: threading.Event | None = None,
) -> PushResult:
    """What `POST /api/{kind}/push` does: plan, find the token, push, remember the repo."""
    from mlxbun_cli.completion import remember_repo_id
    from mlxbun_cli.publishing import credentials

    if (job_id is None) == (source_path is None):
        raise InputError("give job_id or source_path (one of them)")
    if source_path is not None and not Path(source_path).expanduser().is_absolute():
        raise InputError("source_path must be an absolute path")
    p = plan(repo_id, source_path=source_path, job_id=job_id, private=bool(private), kind=kind)
    result = execute(p, credentials.require(), cancelled=cancelled)
    remember_repo_id(result.repo_id)
    return result
