"""`mlxbun push` and the publishing routes, against a stand-in Hub (tests/hubstub.py).

The real huggingface_hub client talks to the stub over HTTP (`HF_ENDPOINT`), so
the requests it makes (whoami, create, preupload, commit) and what arrives are
the real ones; the tests check the exact files and card each commit carries.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import socket
import stat
import sys
from pathlib import Path

import httpx
import pexpect
import pytest
from conftest import REPO, run_cli
from hubstub import HubStub

from mlxbun_cli import __version__, completion, paths
from mlxbun_cli.errors import InputError
from mlxbun_cli.jobs.store import JobStore
from mlxbun_cli.publishing import credentials, push

TOKEN = "hf_testWRITEtoken0123456789abcdef"
READ_TOKEN = "hf_testREADtoken0123456789abcdef"
OTHER_TOKEN = "hf_otherENVtoken0123456789abcdef"
SECRETS = (TOKEN, READ_TOKEN, OTHER_TOKEN)


@pytest.fixture(autouse=True)
def hf_home(tmp_path, monkeypatch):
    """huggingface_hub's own token file and home in a temp dir; no token in the env."""
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_TOKEN_PATH", str(home / "token"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    return home


@pytest.fixture
def hub(monkeypatch):
    server = HubStub(
        tokens={TOKEN: "alice", READ_TOKEN: "alice"},
        read_only={READ_TOKEN},
        orgs={"alice": {"acme"}},
    ).start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield server
    server.close()


@pytest.fixture
def online(monkeypatch):
    """huggingface_hub reads HF_HUB_OFFLINE once, at import: switch it for in-process tests."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def mlxbun(*args: str, token: str | None = TOKEN, input: str | None = None, **env: str):
    """`mlxbun ARGS` online, with HF_TOKEN when given; asserts no secret is ever shown."""
    extra = {"HF_HUB_OFFLINE": "0", **env}
    if token is not None:
        extra["HF_TOKEN"] = token
    proc = run_cli(*args, input=input, env=extra)
    for secret in SECRETS:
        assert secret not in proc.stdout and secret not in proc.stderr, args
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def one_error(proc) -> str:
    """The error line of a failed command: exactly one, plus at most a hint."""
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and len(lines) <= 2, proc.stderr
    assert all(line.startswith(("error: ", "hint: ")) for line in lines), proc.stderr
    return errors[0]


def tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def card_meta(card: str) -> list[str]:
    assert card.startswith("---\n")
    return card.split("---\n")[1].splitlines()


def job_record(kind: str, params: dict, output: Path, state: str = "succeeded") -> str:
    """A job in the store (the daemon's, by MLXBUN_HOME) in `state`, writing `output`."""
    store = JobStore()
    job = store.create(kind, params, output=str(output))
    if state != "queued":
        store.start_run(job.id)
    if state not in ("queued", "running"):
        store.finish(job.id, state, error=None if state == "succeeded" else "it broke")
    return job.id


@pytest.fixture
def adapter_dir(tmp_path) -> Path:
    out = tmp_path / "my-lora"
    (out / "checkpoint").mkdir(parents=True)
    config = {
        "fine_tune_type": "lora",
        "num_layers": 4,
        "lora_parameters": {"rank": 8, "scale": 20.0, "dropout": 0.0},
        "model": "acme/base-model",
        "data": "/home/someone/private/train.jsonl",
        "iters": 30,
        "batch_size": 2,
        "learning_rate": 1e-05,
        "max_seq_length": 512,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    (out / "adapters.safetensors").write_bytes(b"\x08" * 4096)
    (out / "0000010_adapters.safetensors").write_bytes(b"old checkpoint")
    (out / "checkpoint" / "state.safetensors").write_bytes(b"optimizer state")
    (out / ".DS_Store").write_bytes(b"junk")
    return out


@pytest.fixture
def dataset_file(tmp_path) -> Path:
    path = tmp_path / "answers.out.jsonl"
    rows = [{"custom_id": f"r{i}", "response": {"body": {"text": f"answer {i}"}}} for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


# --- credentials --------------------------------------------------------------------------


def test_login_status_logout(hub, hf_home, isolated_home):
    saved = isolated_home / "config" / "hf_token"
    proc = mlxbun("push", "status", "--json", token=None)
    assert json.loads(proc.stdout)["hasToken"] is False
    proc = mlxbun("push", "status", token=None)
    assert "no Hugging Face token" in proc.stdout and "mlxbun push login" in proc.stdout

    proc = mlxbun("push", "login", "--token", TOKEN, token=None)
    assert proc.returncode == 0, proc.stderr
    assert f"logged in as alice: {saved} (mode 0600)" in proc.stdout
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert saved.read_text() == TOKEN + "\n"
    assert [p.name for p in saved.parent.iterdir() if "hf_token" in p.name] == ["hf_token"]
    assert hub.auth == [f"Bearer {TOKEN}"]  # one whoami, with that token

    proc = mlxbun("push", "status", "--json", token=None)
    status = json.loads(proc.stdout)
    assert status["hasToken"] and status["source"] == {"source": "mlxbun", "where": str(saved)}
    assert status["saved_mode"] == "0o600"
    proc = mlxbun("push", "status", token=OTHER_TOKEN)
    assert "token in force: from HF_TOKEN" in proc.stdout
    assert f"also set, not used: mlxbun's login ({saved})" in proc.stderr

    # A token the Hub refuses is not saved: the old one stays.
    proc = mlxbun("push", "login", "--token", OTHER_TOKEN, token=None)
    assert proc.returncode == 2 and "refused this token (401" in one_error(proc)
    assert saved.read_text() == TOKEN + "\n"

    # The Hub out of reach: saved anyway, with a warning. From a pipe, too.
    proc = mlxbun(
        "push", "login", token=None, HF_ENDPOINT=closed_port_url(), input=READ_TOKEN + "\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "token saved" in proc.stdout and "warning: saved without checking" in proc.stderr
    assert "cannot reach the Hugging Face Hub" in proc.stderr
    assert saved.read_text() == READ_TOKEN + "\n" and stat.S_IMODE(saved.stat().st_mode) == 0o600

    proc = mlxbun("push", "logout", token=None)
    assert proc.returncode == 0 and f"removed {saved}" in proc.stdout and not saved.exists()
    proc = mlxbun("push", "logout", token=None)
    assert proc.returncode == 0 and "no saved token" in proc.stderr

    proc = mlxbun("push", "login", "--token", TOKEN, "--json", token=OTHER_TOKEN)
    assert json.loads(proc.stdout) == {
        "ok": True,
        "path": str(saved),
        "user": "alice",
        "warning": None,
        "overridden_by": "HF_TOKEN",
    }
    mlxbun("push", "logout", token=None)

    # huggingface_hub's own login is the last source.
    (hf_home / "token").parent.mkdir(parents=True, exist_ok=True)
    (hf_home / "token").write_text(TOKEN)
    proc = mlxbun("push", "status", token=None)
    assert f"token in force: from huggingface_hub's login ({hf_home / 'token'})" in proc.stdout


def test_token_precedence(monkeypatch, hf_home):
    assert credentials.resolve() is None
    (hf_home / "token").parent.mkdir(parents=True)
    (hf_home / "token").write_text(READ_TOKEN + "\n")
    assert credentials.resolve().source == "huggingface_hub"
    credentials.save(TOKEN)
    assert (credentials.resolve().source, credentials.resolve().token) == ("mlxbun", TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", OTHER_TOKEN)
    assert credentials.resolve().where == "HUGGING_FACE_HUB_TOKEN"
    monkeypatch.setenv("HF_TOKEN", OTHER_TOKEN)
    found = credentials.resolve()
    assert (found.source, found.where, found.token) == ("env", "HF_TOKEN", OTHER_TOKEN)
    flagged = credentials.resolve(f"  {TOKEN}\n")
    assert (flagged.source, flagged.token) == ("flag", TOKEN)
    assert [c.source for c in credentials.all_sources()] == ["env", "mlxbun", "huggingface_hub"]
    # The token never shows in a repr or in what describes its source.
    assert TOKEN not in repr(flagged) and TOKEN not in json.dumps(flagged.as_dict())
    for bad in ("", "  ", "two words", "a\x00b"):
        with pytest.raises(InputError) as caught:
            credentials.resolve(bad)
        assert bad.strip() == "" or bad not in caught.value.message


def test_saved_token_is_0600_from_creation_and_replaced_atomically(isolated_home):
    old = os.umask(0)  # even a permissive umask gives 0600
    try:
        path = credentials.save(TOKEN)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        inode = path.stat().st_ino
        credentials.save(READ_TOKEN)
    finally:
        os.umask(old)
    assert path.read_text() == READ_TOKEN + "\n" and path.stat().st_ino != inode  # renamed in
    assert sorted(p.name for p in path.parent.iterdir()) == ["hf_token"]  # no temp file left
    assert path == paths.config_dir() / "hf_token"
    assert credentials.remove() and not credentials.remove()


# --- pushing ----------------------------------------------------------------------------------


def test_push_model_then_unchanged_then_changed(hub, tiny_model_dir, tmp_path):
    before = tree(tiny_model_dir)
    proc = mlxbun("push", str(tiny_model_dir), "alice/tiny", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    repo = hub.repo("alice/tiny")
    assert out == {
        "ok": True,
        "url": f"{hub.url}/alice/tiny",
        "repo_id": "alice/tiny",
        "repo_type": "model",
        "kind": "model",
        "files": sorted(before) + ["README.md"],
        "commit": repo.sha,
        "up_to_date": False,
    }
    assert hub.creates == [{"name": "tiny", "organization": "alice", "type": "model"}]
    (commit,) = hub.commits
    assert commit.summary == "Upload model with mlxbun"
    assert set(commit.files) == set(before) | {"README.md"}
    assert all(commit.files[name] == data for name, data in before.items())
    card = commit.files["README.md"].decode()
    assert card_meta(card) == [
        "library_name: mlx",
        "pipeline_tag: text-generation",
        "tags:",
        "- mlx",
        "- mlxbun",
    ]
    assert "# tiny\n" in card and "| architecture | qwen3 |" in card
    assert f"Pushed with mlxbun {__version__}" in card and "mlxbun chat alice/tiny" in card
    assert tree(tiny_model_dir) == before  # nothing written into the folder
    assert set(hub.auth) == {f"Bearer {TOKEN}"}
    assert completion.complete_repo_id("alice/") == [("alice/tiny", "pushed before")]

    # The same content again: no second commit, and it says so.
    proc = mlxbun("push", str(tiny_model_dir), "alice/tiny")
    assert proc.returncode == 0, proc.stderr
    assert (
        "alice/tiny is already up to date" in proc.stderr and "nothing was committed" in proc.stderr
    )
    assert proc.stdout.strip() == f"{hub.url}/alice/tiny"
    assert len(hub.commits) == 1 and hub.repo("alice/tiny").sha == repo.sha

    # One file changed: the commit carries only that file.
    copy = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, copy)
    made = 1_700_000_000  # 2023-11-14: the card's "made" date moves, nothing else
    for f in copy.iterdir():
        os.utime(f, (made, made))
    proc = mlxbun("push", str(copy), "alice/tiny", "--json")
    assert json.loads(proc.stdout)["up_to_date"] is False
    assert set(hub.commits[-1].files) == {"README.md"}
    assert "| made | 2023-11-14 |" in hub.commits[-1].files["README.md"].decode()
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # same size, other content
    (copy / "model.safetensors").write_bytes(bytes(weights))
    os.utime(copy / "model.safetensors", (made, made))
    proc = mlxbun("push", str(copy), "alice/tiny", "--json")
    assert hub.commits[-1].files == {"model.safetensors": bytes(weights)}
    assert json.loads(proc.stdout)["commit"] == hub.repo("alice/tiny").sha


def test_push_private_into_an_org_and_bare_names(hub, dataset_file):
    proc = mlxbun("push", str(dataset_file), "acme/answers", "--private", "--json")
    assert proc.returncode == 0, proc.stderr
    assert hub.creates[-1] == {
        "name": "answers",
        "organization": "acme",
        "visibility": "private",
        "type": "dataset",
    }
    assert hub.repo("acme/answers", "dataset").private
    # A bare NAME lands in the token's namespace; the URL says where.
    proc = mlxbun("push", str(dataset_file), "answers", "--json")
    assert json.loads(proc.stdout)["url"] == f"{hub.url}/datasets/alice/answers"
    assert 'load_dataset("alice/answers")' in hub.commits[-1].files["README.md"].decode()
    assert hub.creates[-1] == {"name": "answers", "organization": None, "type": "dataset"}
    # --private on an existing public repo: pushed, with a warning that it stays public.
    proc = mlxbun("push", str(dataset_file), "alice/answers", "--private")
    assert proc.returncode == 0 and "already existed as a public repo" in proc.stderr
    assert not hub.repo("alice/answers", "dataset").private


def test_push_adapter(hub, adapter_dir):
    before = tree(adapter_dir)
    proc = mlxbun("push", str(adapter_dir), "alice/my-lora", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["repo_type"] == "model"
    (commit,) = hub.commits
    assert commit.repo_type == "model"
    assert sorted(commit.files) == ["README.md", "adapter_config.json", "adapters.safetensors"]
    assert commit.files["adapters.safetensors"] == before["adapters.safetensors"]
    card = commit.files["README.md"].decode()
    assert card_meta(card) == [
        "library_name: mlx",
        "pipeline_tag: text-generation",
        "base_model: acme/base-model",
        "base_model_relation: adapter",
        "tags:",
        "- mlx",
        "- mlxbun",
        "- lora",
    ]
    assert "A LORA adapter for `acme/base-model`" in card and "| rank | 8 |" in card
    assert "| training data | `train.jsonl` |" in card and "/home/someone" not in card
    assert tree(adapter_dir) == before


def test_large_files_arrive_whole(hub, adapter_dir):
    weights = os.urandom(24 << 20)
    (adapter_dir / "adapters.safetensors").write_bytes(weights)
    proc = mlxbun("push", str(adapter_dir), "alice/big-lora")
    assert proc.returncode == 0, proc.stderr
    assert hub.commits[-1].files["adapters.safetensors"] == weights


def test_push_dataset_file_and_folder(hub, dataset_file, tmp_path):
    proc = mlxbun("push", str(dataset_file), "alice/answers", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["repo_type"], out["url"]) == ("dataset", f"{hub.url}/datasets/alice/answers")
    (commit,) = hub.commits
    assert commit.repo_type == "dataset"
    assert commit.files["answers.out.jsonl"] == dataset_file.read_bytes()
    card = commit.files["README.md"].decode()
    assert card_meta(card) == ["tags:", "- mlxbun", "size_categories:", "- n<1K"]
    assert "3 rows in 1 JSON Lines file." in card and "| `answers.out.jsonl` | 3 |" in card
    assert 'load_dataset("alice/answers")' in card

    folder = tmp_path / "data"
    (folder / "more").mkdir(parents=True)
    shutil.copy(dataset_file, folder / "train.jsonl")
    (folder / "more" / "test.jsonl").write_text('{"a": 1}\n')
    (folder / "README.md").write_text("# my own card\n")
    (folder / "notes.txt").write_text("not sent")
    mlxbun("push", str(folder), "alice/data")
    assert hub.commits[-1].files == {
        "train.jsonl": dataset_file.read_bytes(),
        "more/test.jsonl": b'{"a": 1}\n',
        "README.md": b"# my own card\n",  # the folder's own card, as it is
    }


def test_push_job_outputs(hub, tiny_model_dir, tmp_path, dataset_file, adapter_dir):
    model = tmp_path / "tiny-4bit"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": 4, "mode": "affine"}
    (model / "config.json").write_text(json.dumps(config))
    params = {"model": "Qwen/Qwen3-0.6B", "bits": 4, "group_size": 64, "recipe": None}
    job_id = job_record("quantize", {**params, "dtype": None, "name": "tiny-4bit"}, model)
    proc = mlxbun("push", "--job", job_id[4:], "alice/tiny-4bit", "--json")  # an id prefix
    assert proc.returncode == 0, proc.stderr
    commit = hub.commits[-1]
    assert commit.description.endswith(f"from job {job_id}; pushed by mlxbun {__version__}.")
    card = commit.files["README.md"].decode()
    assert card_meta(card) == [
        "library_name: mlx",
        "pipeline_tag: text-generation",
        "base_model: Qwen/Qwen3-0.6B",
        "base_model_relation: quantized",
        "tags:",
        "- mlx",
        "- mlxbun",
        "- quantized",
        "- 4-bit",
    ]
    assert "A 4-bit MLX quantization of `Qwen/Qwen3-0.6B`" in card
    assert "| group size | 64 |" in card and f"by job `{job_id}`" in card

    params = {"input": "/home/someone/prompts.jsonl", "model": "demo", "concurrency": 4}
    params["defaults"] = {"temperature": 0.2}
    job_id = job_record("dataset", params, dataset_file)
    mlxbun("push", "--job", job_id, "alice/generated")
    commit = hub.commits[-1]
    assert commit.repo_type == "dataset" and "answers.out.jsonl" in commit.files
    card = commit.files["README.md"].decode()
    assert "- synthetic" in card_meta(card) and "| generated by | `demo` |" in card
    assert "| requests from | `prompts.jsonl` |" in card and "/home/someone" not in card
    assert '| request defaults | {"temperature": 0.2} |' in card

    job_id = job_record("finetune", {"model": "acme/base-model", "rank": 16}, adapter_dir)
    mlxbun("push", "--job", job_id, "alice/lora")
    assert "| rank | 16 |" in hub.commits[-1].files["README.md"].decode()


def test_dry_run_touches_no_network(hub, tiny_model_dir):
    proc = mlxbun("push", str(tiny_model_dir), "alice/tiny", "--dry-run", "--json", token=None)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    sizes = {p.name: p.stat().st_size for p in tiny_model_dir.iterdir()}
    files = {f["path"]: f["size"] for f in plan["files"]}
    assert {k: v for k, v in files.items() if k != "README.md"} == sizes
    assert files["README.md"] == len(plan["card"].encode())
    assert plan["total_bytes"] == sum(files.values()) and plan["token_source"] is None
    assert (plan["repo_type"], plan["kind"], plan["dry_run"]) == ("model", "model", True)
    proc = mlxbun("push", str(tiny_model_dir), "alice/tiny", "--dry-run", HF_HUB_OFFLINE="1")
    assert "dry run: would push the model" in proc.stdout and "README.md (generated)" in proc.stdout
    assert "token: from HF_TOKEN" in proc.stdout and "library_name: mlx" in proc.stdout
    assert hub.requests == []


@pytest.mark.parametrize(
    "args, env, code, message",
    [
        (["{model}", "alice/tiny"], {"token": None}, 2, "no Hugging Face token: pass --token, set HF_TOKEN, or run `mlxbun push login`"),
        (["{model}", "alice/a/b"], {}, 2, "'alice/a/b' is not a valid Hub repo id"),
        (["{model}", "alice/x..y"], {}, 2, "Cannot have -- or .. in repo_id"),
        (["{tmp}/nope", "alice/x"], {}, 2, "nope: no such file or directory"),
        (["{tmp}/junk", "alice/x"], {}, 2, "holds no model, adapter or dataset"),
        (["{tmp}/junk/notes.txt", "alice/x"], {}, 2, "is not a model, adapter or dataset"),
        (["{tmp}/no-weights", "alice/x"], {}, 2, "has config.json but no *.safetensors"),
        (["{tmp}/bad.jsonl", "alice/x"], {}, 2, "bad.jsonl line 2 is not JSON"),
        (["--job", "job_nope", "alice/x"], {}, 2, "no job 'job_nope'"),
        (["{model}"], {}, 2, "give the repo to push to"),
        (["{model}", "alice/tiny"], {"token": OTHER_TOKEN}, 1, "the Hub refused the token from HF_TOKEN (401 Unauthorized)"),
        (["{model}", "alice/tiny", "--token", READ_TOKEN], {}, 1, "the token from --token may not create the repo alice/tiny (403 Forbidden)"),
        (["{model}", "bob/tiny"], {}, 1, "may not create the repo bob/tiny (403 Forbidden)"),
        (["{model}", "alice/tiny"], {"HF_HUB_OFFLINE": "1"}, 1, "cannot create the repo alice/tiny: offline mode is on"),
        (["{model}", "alice/tiny"], {"down": True}, 1, "cannot reach the Hugging Face Hub at http://127.0.0.1:"),
        (["{model}", "alice/tiny"], {"fail": "commit"}, 1, "the Hub refused to commit the files alice/tiny (409 Conflict): busy"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(hub, tiny_model_dir, tmp_path, args, env, code, message):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    (tmp_path / "no-weights").mkdir()
    (tmp_path / "no-weights" / "config.json").write_text("{}")
    (tmp_path / "bad.jsonl").write_text('{"ok": 1}\n{oops\n')
    env = dict(env)
    if env.pop("down", False):
        env["HF_ENDPOINT"] = closed_port_url()
    if fail := env.pop("fail", None):
        hub.fail[fail] = (409, "busy")
    token = env.pop("token", TOKEN)
    before = tree(tiny_model_dir)
    args = [a.format(model=tiny_model_dir, tmp=tmp_path) for a in args]
    proc = mlxbun("push", *args, token=token, **env)
    assert proc.returncode == code, proc.stderr
    assert message in one_error(proc)
    assert tree(tiny_model_dir) == before and not hub.commits
    if code == 2:  # refused before any network
        assert hub.requests == []


def test_jobs_that_cannot_be_pushed(tmp_path, tiny_model_dir):
    for state in ("running", "failed", "cancelled"):
        job_id = job_record("quantize", {}, tiny_model_dir, state=state)
        with pytest.raises(InputError, match=f"job {job_id} is {state}: only a succeeded job"):
            push.plan("alice/x", job_id=job_id)
    job_id = job_record("quantize", {}, tiny_model_dir)
    with pytest.raises(InputError, match=f"job {job_id} is a quantize job, not a dataset job"):
        push.plan("alice/x", job_id=job_id, kind="dataset")
    job_id = job_record("dataset", {}, tiny_model_dir)  # an output that is not a dataset
    with pytest.raises(InputError, match=f"job {job_id}'s output .* is a model, not a dataset"):
        push.plan("alice/x", job_id=job_id)
    gone = job_record("quantize", {}, tmp_path / "deleted")
    with pytest.raises(InputError, match="deleted: no such file or directory"):
        push.plan("alice/x", job_id=gone)
    with pytest.raises(InputError, match="give a PATH or --job ID"):
        push.plan("alice/x", source_path=tiny_model_dir, job_id=job_id)


# --- the daemon's routes ------------------------------------------------------------------------


def test_routes_on_a_real_daemon(hub, tiny_model_dir, isolated_home, dataset_file, hf_home):
    from serverutil import start_server

    env = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1,localhost"}
    srv = start_server(tiny_model_dir, isolated_home, env=env)
    try:
        api = httpx.Client(base_url=srv.url, timeout=30)
        assert api.get("/api/settings/hf-token").json() == {"ok": True, "hasToken": False}

        def refused(path: str, body: object, message: str) -> None:
            raw = body if isinstance(body, str) else json.dumps(body)
            r = api.post(path, content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 400 and set(r.json()) == {"ok", "error"}, r.text
            assert r.json()["ok"] is False and r.json()["error"].startswith(message), r.text

        for body in ("[]", "not json", "null", '"token"'):
            refused("/api/settings/hf-token", body, "expected a JSON object")
        for body in ({}, {"token": ""}, {"token": "  "}, {"token": 5}):
            refused("/api/settings/hf-token", body, "token required")
        refused(
            "/api/settings/hf-token",
            {"token": OTHER_TOKEN},
            "the Hub refused this token (401 Unauthorized): it was not saved",
        )

        r = api.post("/api/settings/hf-token", json={"token": TOKEN})
        assert r.json() == {"ok": True, "user": "alice", "warning": None}
        saved = isolated_home / "config" / "hf_token"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and saved.read_text() == TOKEN + "\n"
        assert api.get("/api/settings/hf-token").json() == {"ok": True, "hasToken": True}

        push_path = "/api/quantize/push"
        refused(push_path, "[1]", "expected a JSON object")
        refused(push_path, {}, "repo_id required")
        refused(push_path, {"repo_id": " "}, "repo_id required")
        refused(
            push_path,
            {"repo_id": "a/b", "job_id": 5, "private": 1},
            "job_id must be a nonempty string",
        )
        refused(
            push_path,
            {"repo_id": "a/b", "source_path": ""},
            "source_path must be a nonempty string",
        )
        refused(push_path, {"repo_id": "a/b", "private": "yes"}, "private must be a boolean")
        refused(push_path, {"repo_id": "a/b"}, "give job_id or source_path (one of them)")
        both = {"repo_id": "a/b", "job_id": "j", "source_path": "/x"}
        refused(push_path, both, "give job_id or source_path (one of them)")
        refused(push_path, {"repo_id": "a/b", "job_id": "job_nope"}, "no job 'job_nope'")
        refused(
            push_path,
            {"repo_id": "a/b", "source_path": "rel/path"},
            "source_path must be an absolute path",
        )
        refused(
            push_path,
            {"repo_id": "a/b/c", "source_path": str(tiny_model_dir)},
            "'a/b/c' is not a valid Hub repo id",
        )
        refused(
            "/api/dataset/push",
            {"repo_id": "a/b", "source_path": str(tiny_model_dir)},
            f"{tiny_model_dir} is a model, not a dataset",
        )
        assert hub.commits == []

        job_id = job_record("quantize", {"model": "acme/base"}, tiny_model_dir)
        refused(
            "/api/dataset/push",
            {"repo_id": "alice/q", "job_id": job_id},
            f"job {job_id} is a quantize job, not a dataset job",
        )
        failed = job_record("quantize", {}, tiny_model_dir, state="failed")
        refused(
            push_path,
            {"repo_id": "alice/q", "job_id": failed},
            f"job {failed} is failed: only a succeeded job can be pushed",
        )

        r = api.post(push_path, json={"repo_id": "alice/q", "job_id": job_id})
        assert r.json() == {"ok": True, "url": f"{hub.url}/alice/q"}, r.text
        assert "base_model: acme/base" in hub.commits[-1].files["README.md"].decode()
        r = api.post(
            "/api/dataset/push",
            json={"repo_id": "alice/d", "source_path": str(dataset_file), "private": True},
        )
        assert r.json() == {"ok": True, "url": f"{hub.url}/datasets/alice/d"}, r.text
        assert hub.repo("alice/d", "dataset").private
        refused(
            "/api/finetune/push",
            {"repo_id": "bob/x", "source_path": str(tiny_model_dir)},
            f"{tiny_model_dir} is a model, not an adapter",
        )

        r = api.get(push_path)
        assert r.status_code == 405 and r.json()["ok"] is False
        assert api.post("/api/other/push", json={}).status_code == 404
        for response_text in (r.text, api.get("/api/settings/hf-token").text):
            assert TOKEN not in response_text
        assert set(hub.auth) == {f"Bearer {OTHER_TOKEN}", f"Bearer {TOKEN}"}  # the refused login
    finally:
        assert srv.stop() == 0, srv.output()
    for secret in SECRETS:
        assert secret not in srv.output()


def _asgi_post(app, path: str, body: dict, disconnect, answered=None) -> tuple[int, dict]:
    """POST to the ASGI app in process; `disconnect` awaits, then the client goes away.

    `answered` runs once the response is sent (asyncio.run then waits for the
    push thread to end).
    """
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    sent_body = False
    messages: list[dict] = []

    async def receive() -> dict:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await disconnect()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        messages.append(message)
        if message["type"] == "http.response.body" and answered is not None:
            answered()

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return status, json.loads(data)


def test_a_client_that_leaves_gets_499_and_no_commit(hub, online, monkeypatch, dataset_file):
    from mlxbun_cli.catalog import ModelRef
    from mlxbun_cli.server.parent import create_parent_app
    from mlxbun_cli.server.state import ServeOptions

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    app, _ = create_parent_app(ServeOptions(isolated=True), ModelRef("m", Path("."), "path"))
    body = {"repo_id": "alice/d", "source_path": str(dataset_file)}

    async def at_once() -> None:
        pass

    # Gone before the push starts: 499, and the Hub never hears of it.
    assert _asgi_post(app, "/api/dataset/push", body, at_once) == (
        499,
        {"ok": False, "error": "Request cancelled"},
    )
    assert hub.requests == []

    # Gone while the files upload: 499 at once; the push stops before its commit.
    release = hub.hold("preupload")

    async def during_upload() -> None:
        while not hub.arrived["preupload"].is_set():
            await asyncio.sleep(0.01)

    status, data = _asgi_post(app, "/api/dataset/push", body, during_upload, release.set)
    assert (status, data) == (499, {"ok": False, "error": "Request cancelled"})
    # The thread has ended (asyncio.run waited for it): the repo was made, nothing committed.
    assert hub.repo("alice/d", "dataset") is not None and hub.commits == []
    assert not any(path.endswith("/commit/main") for _, path in hub.requests)


def _spawn(*args: str) -> pexpect.spawn:
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "TERM": "xterm", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "mlxbun_cli", *args],
        env=env,
        cwd=str(REPO),
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 120),
    )
    child.logfile_read = io.StringIO()
    return child


def test_login_prompt_hides_the_token_and_push_shows_progress(hub, tiny_model_dir, isolated_home):
    child = _spawn("push", "login")
    child.expect("Hugging Face token: ")
    child.sendline(TOKEN)
    child.expect("logged in as alice")
    child.expect(pexpect.EOF)
    screen = child.logfile_read.getvalue()
    assert TOKEN not in screen and child.wait() == 0
    assert (isolated_home / "config" / "hf_token").read_text() == TOKEN + "\n"

    # On a terminal: one line per step, each ticked off, then the URL.
    child = _spawn("push", str(tiny_model_dir), "alice/tiny")
    child.expect(pexpect.EOF)
    screen = child.logfile_read.getvalue()
    assert child.wait() == 0, screen
    for step in ("repo: model repo alice/tiny", "upload: 6 files, ", "commit: one commit"):
        assert step in screen, screen
    assert "✓" in screen and f"{hub.url}/alice/tiny" in screen and TOKEN not in screen
