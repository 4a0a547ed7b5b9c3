"""A Hugging Face Hub emulator on real HTTP (127.0.0.1, ephemeral port) for the real `hf` CLI.

Serves what `hf download` (huggingface_hub 1.17.0, reached through `HF_ENDPOINT`) asks for,
read from its source (`_snapshot_download.py`, `file_download.py`, `hf_api.py`,
`utils/_http.py`):

- `GET /api/{models|datasets}/{repo}/revision/{rev}`: the repo's info, `sha` (the commit the
  revision points at) and `siblings` (its files). `snapshot_download` calls this first.
  `GET /api/datasets/{repo}` (`HfApi.dataset_info` without a revision: the default branch)
  answers the same; a dataset's info carries `cardData`, its README's YAML header, where
  `dataset_info.splits` gives rows and bytes per split (hf_api.py `DatasetInfo`).
- `GET /api/{models|datasets}/{repo}/tree/{rev}?recursive=True`: the files as
  `list_repo_tree` reads them (`[{type: file|directory, path, size, oid}]`, hf_api.py
  `RepoFile`/`RepoFolder`); `snapshot_download` lists the tree when an info has no siblings
  (`siblings=False` repos), as for the Hub's very large repos (_snapshot_download.py).
- `GET /size?dataset={repo}`: the dataset viewer's size answer (datasets-server.huggingface.co,
  documented at https://huggingface.co/docs/dataset-viewer/size) for repos given
  `viewer_size`; 404 with `{"error": ...}` for others.
- `HEAD /{repo}/resolve/{rev}/{file}` (datasets under `/datasets/...`): the file's metadata
  (`X-Repo-Commit`, `ETag`, `Content-Length`); `GET` the same URL: its bytes, with `Range`
  honoured (hf resumes an `.incomplete` file with `Range: bytes=N-`; orch's host check asks
  `bytes=0-N`), 206 with `Content-Range` for a ranged request.

What `hf upload` (the same version: `hf_api.create_repo`, `create_commit`, `_commit_api.py`,
`lfs.py`) sends, with a token only (a write needs an account: 401 otherwise):

- `POST /api/repos/create` `{name, organization, visibility?, type}`: 200 `{url}`; 409 when
  the repo exists (the client's `exist_ok`); another account's namespace is a 403;
- `POST /api/models/{repo}/preupload/{rev}`: each file's `uploadMode` (`lfs` for binary or
  > 10 MB content, else `regular`), as the Hub decides it;
- `POST /{repo}.git/info/lfs/objects/batch`: `basic` transfer, an `upload` href per object
  not stored yet; `PUT /lfs/{oid}`: the bytes (checked against the oid);
- `POST /api/models/{repo}/commit/{rev}` (NDJSON: header, `file` base64, `lfsFile` oid):
  a new commit with those files; an `lfsFile` whose bytes never arrived is a 400.

Every answer carries an `X-Request-Id` (`providers.sim.hubserver.request_id`), which hf
shows after the first line of an error it does not map. Errors carry the headers the real
Hub sends and the client maps to exceptions (`X-Error-Code: RepoNotFound | RevisionNotFound |
GatedRepo | EntryNotFound`, `X-Error-Message`, a JSON `{"error": ...}` body):

- `GET /api/{models|datasets}/{repo}/auth-check`: what `HfApi.auth_check` asks (200 when
  the token may read the repo); orch asks it from the controller before renting;
- missing repo: 401 without a token, 404 with one (the Hub hides private repos that way);
- private repo: exactly a missing repo's answers (info, auth-check, files) unless the token's
  account may read it (`accepted`);
- gated repo: the info is public; auth-check and every file answer 401 without a token,
  403 with a token of an account that has not accepted the licence;
- unknown revision: 404 `RevisionNotFound`;
- a token the Hub does not know: 401 "Invalid credentials in Authorization header", no code;
- `GET /api/whoami-v2` (`HfApi.whoami`, which `hf auth login` reads
  `auth.accessToken.role` from: `_login.py`): the token's account (`name`, `orgs`) and
  `auth.accessToken` with its `role` (`read`, `write`, or `fineGrained` with
  `fineGrained: {canReadGatedRepos, global, scoped: [{entity: {_id, type, name},
  permissions}]}`, the shape the Hub answers for fine-grained tokens); orch asks it before
  renting a job that pushes to the Hub. A read token, or a fine-grained one without
  `repo.write` on the namespace, is refused every write (403);
- `slow`: the next N file bodies stall (longer than the client's read timeout) before the
  first byte; `truncated`: the next N file bodies stop halfway and the connection closes.

    with HubEmulator() as hub:
        hub.add_repo("org/name", {"config.json": b"{}"})
        env HF_ENDPOINT=hub.url hf download org/name --local-dir DIR
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit

from providers.sim.hubserver import request_id

from . import hubwrite
from .serve import Served

INVALID_TOKEN = "Invalid credentials in Authorization header"
# What hf adds to an unmapped error's first line; each answer has its own id, so two clients'
# texts for the same refusal differ in it alone (as on the real Hub).
REQUEST_ID = re.compile(r" \(Request ID: Root=1-[0-9a-f]{8}-[0-9a-f]{24}(;[0-9a-f-]+)?\)")


def without_request_id(text: str) -> str:
    """`text` with each of hf's request ids as `(Request ID: <id>)`, so that where it sits is
    still compared; asserting it has one where it names a 401."""
    if "'401 Unauthorized'" in text:
        assert REQUEST_ID.search(text), text
    return REQUEST_ID.sub(" (Request ID: <id>)", text)


@dataclass
class Repo:
    """One repository: its files at every revision (one commit per revision name)."""

    repo_id: str
    repo_type: str  # model | dataset
    files: dict[str, bytes]
    revisions: tuple[str, ...] = ("main",)
    gated: bool = False
    accepted: set[str] = field(default_factory=set)  # tokens whose account may read it
    private: bool = False
    owner: str | None = None  # the token that created it (may write)
    commits: int = 0
    card_data: dict[str, object] | None = None  # the README's YAML header (`cardData`)
    siblings: bool = True  # False: the info lists no files (clients list the tree)
    viewer_size: dict[str, object] | None = None  # the dataset viewer's /size answer

    def hidden_from(self, token: str | None) -> bool:
        """A private repo is invisible to everyone but its readers."""
        return self.private and token not in self.accepted

    def commit(self, revision: str) -> str | None:
        """The commit a revision name (or a commit hash itself) points at."""
        for name in self.revisions:
            sha = hashlib.sha1(f"{self.repo_id}@{name}".encode()).hexdigest()
            if revision in (name, sha):
                return sha
        return None


@dataclass
class Recorded:
    """One request (method, path, whether it carried a token)."""

    method: str
    path: str
    authorized: bool
    status: int = 0


class HubEmulator(Served):
    """The Hub's download endpoints with faults; see the module docstring."""

    def __init__(self, tokens: tuple[str, ...] = (), *, open_models: bool = False) -> None:
        self.tokens = set(tokens)  # tokens the Hub knows; any other one is a 401
        self.repos: dict[tuple[str, str], Repo] = {}
        # Any model repo not added is a public one with no files at `main`, and any token
        # is an account's (the test suite's default Hub, so orch's pre-rental check of any
        # base model passes).
        self.open_models = open_models
        self.requests: list[Recorded] = []
        self.blobs: dict[str, bytes] = {}  # LFS objects by sha256
        # token -> "user[,org...]": the account's name and its organisations (the first is
        # the user); a token not listed is an account named `hf-user` that may write anywhere.
        self.namespaces: dict[str, str] = {}
        self.roles: dict[str, str] = {}  # token -> read | write | fineGrained (default write)
        self.scopes: dict[str, list[dict[str, object]]] = {}  # fineGrained token -> scoped
        self.slow = 0  # file bodies still to stall
        self.stall_s = 3.0
        self.truncated = 0  # file bodies still to cut halfway
        self._lock = threading.Lock()

    # -- lifecycle

    METHODS = ("GET", "HEAD", "POST", "PUT")

    @property
    def url(self) -> str:
        return self.served_url

    # -- setup

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, repo_type: str = "model",
                 revisions: tuple[str, ...] = ("main",), gated: bool = False,
                 accepted: tuple[str, ...] = (), private: bool = False,
                 card_data: dict[str, object] | None = None, siblings: bool = True,
                 viewer_size: dict[str, object] | None = None) -> Repo:
        repo = Repo(repo_id, repo_type, dict(files), revisions, gated, set(accepted), private,
                    card_data=card_data, siblings=siblings, viewer_size=viewer_size)
        self.repos[(repo_type, repo_id)] = repo
        return repo

    # -- serving

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        body = h.command != "HEAD"  # a HEAD answers the headers a GET would, no body
        path = unquote(urlsplit(h.path).path)
        auth = h.headers.get("Authorization") or ""
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        record = Recorded(h.command, path, token is not None)
        with self._lock:
            self.requests.append(record)
        try:
            self._route(h, path, token, body, record)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on a stalled or cut body

    def _error(self, h: BaseHTTPRequestHandler, record: Recorded, status: int, message: str,
               code: str | None, body: bool) -> None:
        record.status = status
        raw = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Request-Id", request_id(h.headers))
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("X-Error-Message", message)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if body:
            h.wfile.write(raw)

    def _find(self, h: BaseHTTPRequestHandler, record: Recorded, repo_type: str, rest: str,
              marker: str, token: str | None, body: bool) -> tuple[Repo, str] | None:
        """(repo, what follows `/marker/`) for `rest` = `{repo_id}/{marker}/...`, or answered."""
        if token is not None and token not in self.tokens and not self.open_models:
            self._error(h, record, 401, INVALID_TOKEN, None, body)
            return None
        if marker == "auth-check" and rest.endswith("/auth-check"):
            repo_id, sep, tail = rest[: -len("/auth-check")], "/", ""
        elif marker == "":  # /api/datasets/{repo}: the info at the default branch
            repo_id, sep, tail = rest, "/", "main"
        else:
            repo_id, sep, tail = rest.partition(f"/{marker}/")
        repo = self.repos.get((repo_type, repo_id)) if sep else None
        if repo is None and sep and self.open_models and repo_type == "model":
            repo = Repo(repo_id, repo_type, {})
        if repo is None or repo.hidden_from(token):
            self._error(h, record, 404 if token else 401, "Repository not found",
                        "RepoNotFound", body)
            return None
        return repo, tail

    def _route(self, h: BaseHTTPRequestHandler, path: str, token: str | None, body: bool,
               record: Recorded) -> None:
        if h.command in ("POST", "PUT"):
            hubwrite.route(self, h, record, path, token)
            return
        if path == "/api/whoami-v2":
            hubwrite.whoami(self, h, record, token, body)
            return
        if path == "/size":
            self._viewer_size(h, record, h.path, body)
            return
        if path.startswith("/api/models/") or path.startswith("/api/datasets/"):
            _, _, kind, rest = path.split("/", 3)
            marker = ("auth-check" if rest.endswith("/auth-check") else "tree"
                      if "/tree/" in rest else "revision" if "/revision/" in rest
                      else "" if kind == "datasets" else "revision")
            found = self._find(h, record, kind[:-1], rest, marker, token, body)
            if found is not None and marker == "auth-check":
                self._auth_check(h, record, found[0], token, body)
            elif found is not None and marker == "tree":
                self._tree(h, record, *found, body)
            elif found is not None:
                self._info(h, record, *found, body)
            return
        repo_type, rest = ("dataset", path[len("/datasets/"):]) \
            if path.startswith("/datasets/") else ("model", path[1:])
        found = self._find(h, record, repo_type, rest, "resolve", token, body)
        if found is not None:
            self._file(h, record, *found, token, body)

    def _info(self, h: BaseHTTPRequestHandler, record: Recorded, repo: Repo, revision: str,
              body: bool) -> None:
        sha = repo.commit(revision)
        if sha is None:
            self._error(h, record, 404, f"Invalid rev id: {revision}", "RevisionNotFound", body)
            return
        info: dict[str, object] = {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24], "id": repo.repo_id,
            "private": repo.private, "gated": "manual" if repo.gated else False,
            "disabled": False, "sha": sha}
        if repo.siblings:
            info["siblings"] = [{"rfilename": name} for name in sorted(repo.files)]
        if repo.card_data is not None:
            info["cardData"] = repo.card_data
        self._json(h, record, info, body)

    def _tree(self, h: BaseHTTPRequestHandler, record: Recorded, repo: Repo, tail: str,
              body: bool) -> None:
        revision, _, folder = tail.partition("/")
        if repo.commit(revision) is None:
            self._error(h, record, 404, f"Invalid rev id: {revision}", "RevisionNotFound", body)
            return
        recursive = "recursive=true" in (urlsplit(h.path).query or "").lower()
        prefix = f"{folder}/" if folder else ""
        entries: dict[str, dict[str, object]] = {}
        for name, content in sorted(repo.files.items()):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            if "/" in rest and not recursive:
                sub = prefix + rest.split("/")[0]
                entries[sub] = {"type": "directory", "path": sub, "size": 0, "oid": "0" * 40}
                continue
            for i in range(rest.count("/")):
                sub = prefix + "/".join(rest.split("/")[: i + 1])
                entries[sub] = {"type": "directory", "path": sub, "size": 0, "oid": "0" * 40}
            entries[name] = {"type": "file", "path": name, "size": len(content),
                             "oid": hashlib.sha1(content).hexdigest()}
        self._json(h, record, list(entries.values()), body)

    def _viewer_size(self, h: BaseHTTPRequestHandler, record: Recorded, raw: str,
                     body: bool) -> None:
        from urllib.parse import parse_qs

        wanted = (parse_qs(urlsplit(raw).query).get("dataset") or [""])[0]
        repo = self.repos.get(("dataset", wanted))
        if repo is None or repo.viewer_size is None or repo.gated or repo.private:
            self._error(h, record, 404, "The dataset does not exist, or is not accessible "
                        "without authentication (private or gated). Please check the spelling "
                        "of the dataset name or retry with authentication.",
                        "DatasetNotFoundError", body)
            return
        self._json(h, record, repo.viewer_size, body)

    def _gate(self, h: BaseHTTPRequestHandler, record: Recorded, repo: Repo,
              token: str | None, body: bool) -> bool:
        """Answer the gate's refusal and return True, or False when `token` may pass."""
        if not repo.gated or token in repo.accepted:
            return False
        kind = repo.repo_type
        if token is None:
            message = (f"Access to {kind} {repo.repo_id} is restricted. You must have "
                       "access to it and be authenticated to access it. Please log in.")
        else:
            message = (f"Access to {kind} {repo.repo_id} is restricted and you are not in "
                       f"the authorized list. Visit https://huggingface.co/{repo.repo_id} "
                       "to ask for access.")
        self._error(h, record, 403 if token else 401, message, "GatedRepo", body)
        return True

    def _auth_check(self, h: BaseHTTPRequestHandler, record: Recorded, repo: Repo,
                    token: str | None, body: bool) -> None:
        if self._gate(h, record, repo, token, body):
            return
        self._json(h, record, {"accessRequest": None}, body)

    def _json(self, h: BaseHTTPRequestHandler, record: Recorded, value: object,
              body: bool) -> None:
        raw = json.dumps(value).encode()
        record.status = 200
        h.send_response(200)
        h.send_header("X-Request-Id", request_id(h.headers))
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if body:
            h.wfile.write(raw)

    def _file(self, h: BaseHTTPRequestHandler, record: Recorded, repo: Repo, tail: str,
              token: str | None, body: bool) -> None:
        revision, _, name = tail.partition("/")
        if self._gate(h, record, repo, token, body):
            return
        sha = repo.commit(revision)
        if sha is None:
            self._error(h, record, 404, f"Invalid rev id: {revision}", "RevisionNotFound", body)
            return
        content = repo.files.get(name)
        if content is None:
            self._error(h, record, 404, "Entry not found", "EntryNotFound", body)
            return
        start, end = 0, len(content) - 1
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range") or "")
        if wanted is not None:  # `bytes=N-` (hf resuming) or `bytes=A-B` (orch's host check)
            start = int(wanted[1])
            end = min(end, int(wanted[2])) if wanted[2] else end
        part = content[start:end + 1]
        record.status = 206 if wanted is not None else 200
        h.send_response(record.status)
        h.send_header("X-Request-Id", request_id(h.headers))
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("X-Repo-Commit", sha)
        h.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
        h.send_header("Accept-Ranges", "bytes")
        if wanted is not None:
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(content)}")
        h.send_header("Content-Length", str(len(part)))
        h.end_headers()
        if not body:
            return
        with self._lock:
            stall = self.slow > 0
            cut = not stall and self.truncated > 0 and len(part) > 1
            self.slow -= stall
            self.truncated -= cut
        if stall:
            time.sleep(self.stall_s)
        if cut:
            h.wfile.write(part[: len(part) // 2])
            h.wfile.flush()
            h.close_connection = True
            return
        h.wfile.write(part)
