"""A stand-in for the Hugging Face Hub on 127.0.0.1: the part of its API mlxbun uses.

The real `huggingface_hub` client runs against it (point it here with
`HF_ENDPOINT`), so tests exercise the library's own requests and parsing.

Downloads (`snapshot_download`, for `mlxbun models pull`):
    GET  /api/{models|datasets}/{repo}[/revision/{rev}]  repo info: sha, private, siblings
    GET  /api/models/{repo}/tree/{sha}                   file listing (one page)
    HEAD/GET /{repo}/resolve/{rev}/{file}                the file, with ETag, X-Repo-Commit,
                                                         Content-Length; Range for resumes
Uploads (`HfApi.create_repo` / `create_commit`, for `mlxbun push`):
    GET  /api/whoami-v2                                  the token's user
    POST /api/repos/create                               {name, organization, visibility, type}
    POST /api/validate-yaml                              README metadata check: always fine
    POST /api/{type}s/{repo}/preupload/{rev}             uploadMode "regular" for every file
                                                         (so content arrives inline), with the
                                                         git-blob oid of the file already there
    POST /api/{type}s/{repo}/commit/{rev}                NDJSON: a header line, then file lines
                                                         with base64 content

Errors carry X-Error-Code / X-Error-Message as the Hub's do (RepoNotFound, GatedRepo, ...).
Tokens: `tokens` maps a token to its user; `read_only` tokens may read but not write. A user
writes to its own namespace and to the orgs in `orgs[user]`. What arrives is kept: `requests`
(method, path), `auth` (Authorization headers), `creates` (create bodies), `commits`.
`fail[endpoint] = (status, message)` makes an endpoint answer an error; `hold(endpoint)`
makes its next requests wait until the returned event is set (`arrived[endpoint]` is set
when one does).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
BAD_TOKEN = "Invalid credentials in Authorization header"


def git_blob_sha1(data: bytes) -> str:
    """What git (and the Hub's preupload `oid`) calls a regular file."""
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class StubRepo:
    files: dict[str, bytes]
    sha: str
    private: bool = False
    owner: str | None = None


@dataclass
class Commit:
    repo_type: str
    repo_id: str
    summary: str
    description: str
    files: dict[str, bytes]  # what this commit added or changed
    deleted: list[str] = field(default_factory=list)
    oid: str = ""


class HubStub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        repos: dict[str, dict[str, bytes]] | None = None,
        gated: set[str] | None = None,
        *,
        tokens: dict[str, str] | None = None,
        read_only: set[str] | None = None,
        orgs: dict[str, set[str]] | None = None,
    ) -> None:
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.gated = gated or set()
        self.tokens = dict(tokens or {})
        self.read_only = set(read_only or ())
        self.orgs = orgs or {}
        self.lock = threading.Lock()
        self.store: dict[tuple[str, str], StubRepo] = {}
        for repo_id, files in (repos or {}).items():
            sha = hashlib.sha1(json.dumps(sorted(files)).encode()).hexdigest()
            self.store[("model", repo_id)] = StubRepo(dict(files), sha)
        self.requests: list[tuple[str, str]] = []
        self.auth: list[str] = []
        self.creates: list[dict] = []
        self.commits: list[Commit] = []
        self.fail: dict[str, tuple[int, str]] = {}
        self.holds: dict[str, threading.Event] = {}
        self.arrived: dict[str, threading.Event] = {}
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> HubStub:
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        for event in self.holds.values():
            event.set()
        self.shutdown()
        self.server_close()

    # -- what tests look at ----------------------------------------------------------

    @property
    def shas(self) -> dict[str, str]:
        return {
            repo_id: repo.sha for (kind, repo_id), repo in self.store.items() if kind == "model"
        }

    def repo(self, repo_id: str, repo_type: str = "model") -> StubRepo | None:
        return self.store.get((repo_type, repo_id))

    def hold(self, endpoint: str) -> threading.Event:
        """Requests to `endpoint` wait until the returned event is set."""
        self.arrived[endpoint] = threading.Event()
        self.holds[endpoint] = threading.Event()
        return self.holds[endpoint]

    def user_for(self, header: str | None) -> str | None:
        if not header or not header.lower().startswith("bearer "):
            return None
        return self.tokens.get(header[7:].strip())


class HubHandler(BaseHTTPRequestHandler):
    server: HubStub

    def log_message(self, *args) -> None:
        pass

    # -- dispatch ------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._read(body=False)

    def do_GET(self) -> None:
        self._read(body=True)

    def do_POST(self) -> None:
        path = unquote(urlparse(self.path).path)
        length = int(self.headers.get("Content-Length") or 0)
        payload = self.rfile.read(length) if length else b""
        self._record(path)
        parts = path.strip("/").split("/")
        if path == "/api/repos/create":
            self._endpoint("create", lambda: self._create(payload))
        elif path == "/api/validate-yaml":
            self._json(200, {"errors": [], "warnings": []})
        elif len(parts) >= 6 and parts[0] == "api" and parts[4] in ("preupload", "commit"):
            kind = parts[1].rstrip("s")
            repo_id, action = "/".join(parts[2:4]), parts[4]
            self._endpoint(action, lambda: self._write(action, kind, repo_id, payload))
        else:
            self._error(404, "", f"no route for POST {path}")

    def _read(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self._record(path)
        parts = path.strip("/").split("/")
        if path == "/api/whoami-v2":
            self._endpoint("whoami", self._whoami)
            return
        if self._bad_token():
            return
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in ("models", "datasets"):
            kind, repo_id = parts[1].rstrip("s"), "/".join(parts[2:4])
            what = parts[4] if len(parts) >= 6 else "revision"
            rev = parts[5] if len(parts) >= 6 else "main"
            if self._check(kind, repo_id, rev):
                self._api(kind, repo_id, what, body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            if self._check("model", repo_id, rev):
                self._file("model", repo_id, name, body)
        elif len(parts) >= 6 and parts[0] == "datasets" and parts[3] == "resolve":
            repo_id, rev, name = "/".join(parts[1:3]), parts[4], "/".join(parts[5:])
            if self._check("dataset", repo_id, rev):
                self._file("dataset", repo_id, name, body)
        else:
            self._error(404, "EntryNotFound")

    def _record(self, path: str) -> None:
        with self.server.lock:
            self.server.requests.append((self.command, path))
            if self.headers.get("Authorization"):
                self.server.auth.append(self.headers["Authorization"])

    def _endpoint(self, name: str, answer) -> None:
        if name in self.server.arrived:
            self.server.arrived[name].set()
        if name in self.server.holds:
            self.server.holds[name].wait(30)
        if name in self.server.fail:
            status, message = self.server.fail[name]
            self._error(status, "", message)
            return
        answer()

    # -- auth ------------------------------------------------------------------------------

    def _bad_token(self) -> bool:
        """A token the Hub does not know is refused on every route, as the Hub does.

        Only when the stub was given tokens: a download-only stub ignores them.
        """
        header = self.headers.get("Authorization")
        if self.server.tokens and header and self.server.user_for(header) is None:
            self._error(401, "", BAD_TOKEN)
            return True
        return False

    def _writer(self, namespace: str | None) -> str | None:
        """The user who may write to `namespace`, or None with the error already sent."""
        header = self.headers.get("Authorization")
        user = self.server.user_for(header)
        if user is None:
            self._error(401, "", BAD_TOKEN if header else "You must be authenticated")
            return None
        token = (header or "")[7:].strip()
        namespace = namespace or user
        if token in self.server.read_only or (
            namespace != user and namespace not in self.server.orgs.get(user, set())
        ):
            self._error(403, "", f"You don't have the rights to write to {namespace}")
            return None
        return user

    def _whoami(self) -> None:
        header = self.headers.get("Authorization")
        user = self.server.user_for(header)
        if user is None:
            self._error(401, "", BAD_TOKEN)
            return
        role = "read" if header[7:].strip() in self.server.read_only else "write"
        self._json(
            200,
            {
                "type": "user",
                "name": user,
                "orgs": [{"name": org} for org in sorted(self.server.orgs.get(user, ()))],
                "auth": {"type": "access_token", "accessToken": {"displayName": "t", "role": role}},
            },
        )

    # -- uploads -----------------------------------------------------------------------------

    def _create(self, payload: bytes) -> None:
        body = json.loads(payload)
        with self.server.lock:
            self.server.creates.append(body)
        user = self._writer(body.get("organization"))
        if user is None:
            return
        kind = body.get("type") or "model"
        repo_id = f"{body.get('organization') or user}/{body['name']}"
        url = f"{self.server.url}/{'' if kind == 'model' else kind + 's/'}{repo_id}"
        with self.server.lock:
            if (kind, repo_id) in self.server.store:
                self._json(409, {"error": "You already created this repo", "url": url})
                return
            sha = hashlib.sha1(f"init {kind} {repo_id}".encode()).hexdigest()
            private = body.get("visibility") == "private"
            files = {".gitattributes": GITATTRIBUTES}
            self.server.store[(kind, repo_id)] = StubRepo(files, sha, private, user)
        self._json(200, {"url": url, "name": repo_id, "id": sha[:24]})

    def _write(self, action: str, kind: str, repo_id: str, payload: bytes) -> None:
        if self._writer(repo_id.split("/")[0]) is None:
            return
        repo = self.server.repo(repo_id, kind)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        elif action == "preupload":
            files = json.loads(payload)["files"]
            self._json(
                200,
                {
                    "files": [
                        {
                            "path": f["path"],
                            "uploadMode": "regular",
                            "shouldIgnore": False,
                            "oid": git_blob_sha1(repo.files[f["path"]])
                            if f["path"] in repo.files
                            else None,
                        }
                        for f in files
                    ]
                },
            )
        else:
            self._commit(kind, repo_id, repo, payload)

    def _commit(self, kind: str, repo_id: str, repo: StubRepo, payload: bytes) -> None:
        lines = [json.loads(line) for line in payload.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            self._error(400, "", "the first line must be the header")
            return
        header, added, deleted = lines[0]["value"], {}, []
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file" and value.get("encoding") == "base64":
                added[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] in ("deletedFile", "deletedFolder"):
                deleted.append(value["path"])
            else:
                self._error(400, "", f"unexpected commit line {line['key']!r}")
                return
        with self.server.lock:
            digest = hashlib.sha1(repo.sha.encode())
            for path, data in sorted(added.items()):
                digest.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
            repo.sha = digest.hexdigest()
            repo.files.update(added)
            for path in deleted:
                repo.files.pop(path, None)
            self.server.commits.append(
                Commit(
                    kind,
                    repo_id,
                    header.get("summary", ""),
                    header.get("description", ""),
                    added,
                    deleted,
                    repo.sha,
                )
            )
        prefix = "" if kind == "model" else kind + "s/"
        self._json(
            200,
            {
                "success": True,
                "commitOid": repo.sha,
                "commitUrl": f"{self.server.url}/{prefix}{repo_id}/commit/{repo.sha}",
                "hookOutput": "",
                "pullRequestUrl": None,
            },
        )

    # -- downloads and repo info -------------------------------------------------------------

    def _check(self, kind: str, repo_id: str, rev: str) -> bool:
        repo = self.server.repo(repo_id, kind)
        user = self.server.user_for(self.headers.get("Authorization"))
        if repo is None or (repo.private and user != repo.owner):
            self._error(404, "RepoNotFound", "Repository not found")
        elif repo_id in self.server.gated:
            self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted.")
        elif rev not in ("main", repo.sha):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        else:
            return True
        return False

    def _api(self, kind: str, repo_id: str, what: str, body: bool) -> None:
        repo = self.server.repo(repo_id, kind)
        assert repo is not None
        if what == "revision":
            data: object = {
                "id": repo_id,
                "sha": repo.sha,
                "private": repo.private,
                "siblings": [{"rfilename": n} for n in repo.files],
            }
        else:
            data = [
                {"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                for n, b in repo.files.items()
            ]
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"}, body)

    def _file(self, kind: str, repo_id: str, name: str, body: bool) -> None:
        repo = self.server.repo(repo_id, kind)
        data = repo.files.get(name) if repo else None
        if repo is None or data is None:
            self._error(404, "EntryNotFound", f"{name} does not exist")
            return
        headers = {
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "X-Repo-Commit": repo.sha,
            "Content-Type": "application/octet-stream",
        }
        start = 0
        if (rng := self.headers.get("Range", "")).startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._send(206 if start else 200, data[start:], headers, body)

    # -- responses -------------------------------------------------------------------------------

    def _json(self, status: int, data: object) -> None:
        self._send(status, json.dumps(data).encode(), {"Content-Type": "application/json"}, True)

    def _error(self, status: int, code: str, message: str = "") -> None:
        headers = {"X-Error-Message": message, "Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers, True)

    def _send(self, status: int, data: bytes, headers: dict, body: bool) -> None:
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)


# What tests/test_models_cmd.py has always called it.
FakeHub = HubStub
