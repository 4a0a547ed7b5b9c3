"""The Hub emulator's write side: what `hf upload` (huggingface_hub 1.17.0) sends.

See the endpoints in `hub.py`'s docstring. Kept apart from the read side, which `hf
download` and orch's pre-rental check use.
"""

from __future__ import annotations

import base64
import hashlib
import json
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hub import HubEmulator, Recorded

# The Hub stores a file in LFS (Xet) when it is binary or larger than this (its preupload
# answer); the client then uploads it through the LFS batch API.
REGULAR_MAX_BYTES = 10 * 1024 * 1024


def read_body(h: BaseHTTPRequestHandler) -> bytes:
    """The request body, by Content-Length or chunked transfer encoding."""
    if "chunked" in (h.headers.get("Transfer-Encoding") or "").lower():
        parts = []
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                h.rfile.readline()
                return b"".join(parts)
            parts.append(h.rfile.read(size))
            h.rfile.readline()
    return h.rfile.read(int(h.headers.get("Content-Length") or 0))


def route(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, path: str,
          token: str | None) -> None:
    data = read_body(h)
    if path.startswith("/lfs/") and h.command == "PUT":
        # A presigned storage URL: the client sends no token there.
        _put_blob(hub, h, record, path[len("/lfs/"):], data)
        return
    if token is None:
        hub._error(h, record, 401, "Invalid username or password.", None, True)
        return
    if token not in hub.tokens and not hub.open_models:
        hub._error(h, record, 401, "Invalid credentials in Authorization header", None, True)
        return
    if path == "/api/repos/create":
        _create(hub, h, record, token, json.loads(data or b"{}"))
    elif path.endswith(".git/info/lfs/objects/batch"):
        _batch(hub, h, record, token, path[1:-len(".git/info/lfs/objects/batch")],
               json.loads(data))
    elif path.startswith("/api/models/") and "/preupload/" in path:
        repo_id = path[len("/api/models/"):].split("/preupload/")[0]
        _preupload(hub, h, record, token, repo_id, json.loads(data))
    elif path.startswith("/api/models/") and "/commit/" in path:
        repo_id = path[len("/api/models/"):].split("/commit/")[0]
        _commit(hub, h, record, token, repo_id, data)
    else:
        hub._error(h, record, 404, f"Cannot {h.command} {path}", None, True)


def may_write(hub: HubEmulator, token: str, namespace: str, repo_id: str | None = None) -> bool:
    """Whether the token may write in `namespace` (its user or an org of it): a write or
    admin token, or a fine-grained one with `repo.write` on the namespace (or on the repo)."""
    allowed = hub.namespaces.get(token)
    if allowed is not None and namespace not in allowed.split(","):
        return False
    role = hub.roles.get(token, "write")
    if role == "fineGrained":
        return any("repo.write" in scope.get("permissions", [])  # type: ignore[operator]
                   and scope.get("entity", {}).get("name") in (namespace, repo_id)  # type: ignore[attr-defined]
                   for scope in hub.scopes.get(token, []))
    return role in ("write", "admin", "contributor")


def whoami(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, token: str | None,
           body: bool) -> None:
    """`GET /api/whoami-v2`: the token's account and the token's role (module docstring)."""
    if token is None:
        hub._error(h, record, 401, "Invalid username or password.", None, body)
        return
    if token not in hub.tokens and not hub.open_models:
        hub._error(h, record, 401, "Invalid credentials in Authorization header", None, body)
        return
    user, *orgs = (hub.namespaces.get(token) or "hf-user").split(",")

    def entity(kind: str, name: str) -> dict[str, object]:
        return {"type": kind, "id": hashlib.md5(name.encode()).hexdigest()[:24], "name": name,
                "fullname": name, "email": None, "canPay": False, "avatarUrl": "",
                "periodEnd": None}

    access: dict[str, object] = {"displayName": "orch-tests",
                                 "role": hub.roles.get(token, "write"),
                                 "createdAt": "2026-01-01T00:00:00.000Z"}
    if access["role"] == "fineGrained":
        access["fineGrained"] = {"canReadGatedRepos": True, "global": [],
                                 "scoped": hub.scopes.get(token, [])}
    answer = {**entity("user", user), "email": f"{user}@example.com", "emailVerified": True,
              "isPro": False, "orgs": [{**entity("org", o), "roleInOrg": "write"} for o in orgs],
              "auth": {"type": "access_token", "accessToken": access}}
    hub._json(h, record, answer, body)


def _writable(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, token: str,
              repo_id: str) -> Any:
    repo = hub.repos.get(("model", repo_id))
    if repo is None or repo.hidden_from(token):
        hub._error(h, record, 404, "Repository not found", "RepoNotFound", True)
        return None
    if not may_write(hub, token, repo_id.split("/")[0], repo_id):
        hub._error(h, record, 403, "You don't have the rights to write to this repository",
                   None, True)
        return None
    return repo


def _create(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, token: str,
            payload: dict[str, Any]) -> None:
    name, org = payload.get("name"), payload.get("organization")
    repo_type = payload.get("type") or "model"
    repo_id = f"{org}/{name}" if org else str(name)
    namespace = org or (hub.namespaces.get(token) or "hf-user").split(",")[0]
    if not may_write(hub, token, namespace, repo_id):
        hub._error(h, record, 403, f'You don\'t have the rights to create a {repo_type} '
                   f'under the namespace "{namespace}"', None, True)
        return
    if (repo_type, repo_id) in hub.repos:
        hub._error(h, record, 409, "You already created this model repo", None, True)
        return
    private = payload.get("visibility") == "private" or payload.get("private") is True
    repo = hub.add_repo(repo_id, {}, repo_type=repo_type, private=private,
                        accepted=(token,))
    repo.owner = token
    hub._json(h, record, {"url": f"{hub.url}/{repo_id}", "name": repo_id}, True)


def _preupload(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, token: str,
               repo_id: str, payload: dict[str, Any]) -> None:
    if _writable(hub, h, record, token, repo_id) is None:
        return
    files = []
    for item in payload.get("files") or []:
        sample = base64.b64decode(item.get("sample") or "")
        binary = b"\0" in sample
        mode = "lfs" if binary or int(item.get("size") or 0) > REGULAR_MAX_BYTES else "regular"
        files.append({"path": item["path"], "uploadMode": mode, "shouldIgnore": False})
    hub._json(h, record, {"files": files}, True)


def _batch(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, token: str,
           repo_id: str, payload: dict[str, Any]) -> None:
    if _writable(hub, h, record, token, repo_id) is None:
        return
    objects = []
    for obj in payload.get("objects") or []:
        entry: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"]}
        if obj["oid"] not in hub.blobs:
            entry["actions"] = {"upload": {"href": f"{hub.url}/lfs/{obj['oid']}"}}
        objects.append(entry)
    hub._json(h, record, {"transfer": "basic", "objects": objects}, True)


def _put_blob(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, oid: str,
              data: bytes) -> None:
    if hashlib.sha256(data).hexdigest() != oid:
        hub._error(h, record, 400, "sha256 of the content does not match the object id",
                   None, True)
        return
    hub.blobs[oid] = data
    hub._json(h, record, {}, True)


def _commit(hub: HubEmulator, h: BaseHTTPRequestHandler, record: Recorded, token: str,
            repo_id: str, data: bytes) -> None:
    repo = _writable(hub, h, record, token, repo_id)
    if repo is None:
        return
    added: dict[str, bytes] = {}
    for line in data.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        value = item.get("value") or {}
        if item.get("key") == "file":
            added[value["path"]] = base64.b64decode(value["content"])
        elif item.get("key") == "lfsFile":
            blob = hub.blobs.get(value["oid"])
            if blob is None or len(blob) != value["size"]:
                hub._error(h, record, 400, f"LFS file {value['path']} was never uploaded",
                           None, True)
                return
            added[value["path"]] = blob
    repo.files.update(added)
    repo.commits += 1
    oid = hashlib.sha1(f"{repo_id}#{repo.commits}".encode()).hexdigest()
    hub._json(h, record, {"commitUrl": f"{hub.url}/{repo_id}/commit/{oid}",
                          "commitOid": oid}, True)
